//! `lattice` — the command-line client of `lattice-runtime` (REST): submit (flags, or a script's
//! `#LATTICE`/`#SBATCH` directives), status, cancel, nodes and admin. The endpoint and tenant come from
//! `--endpoint`/`--tenant`, else `LATTICE_ENDPOINT`/`LATTICE_TENANT`, else
//! `~/.config/lattice/config.yaml` (`endpoint:` or `endpoints:`, `tenant:`), else
//! `http://127.0.0.1:8080`; several endpoints (a comma list: the quorum's members) are tried in turn
//! past one that is down or not the leader. The bearer
//! token from `LATTICE_TOKEN`, the file's `token:`, or what `lattice login` cached for the endpoint
//! (`~/.config/lattice/tokens.json`, refreshed when it expires). For an `https://` endpoint the site CA comes from
//! `LATTICE_CA` or `ca:` (PEM; default: the system's roots), and under mTLS the client certificate from
//! `LATTICE_CLIENT_CERT`/`LATTICE_CLIENT_KEY` or `client_cert:`/`client_key:`.

use anyhow::Result;
use clap::{Parser, Subcommand};
use lattice_cli::client::config::{file_config, http_agent};
use lattice_cli::client::{
    Client, Output, accounting, admin, auth, cache, config, dag, interactive, logs, monitor, nodes, status, submit,
    tasks,
};

#[derive(Parser)]
#[command(name = "lattice", version, about = "Lattice client: submit and manage allocations")]
struct Cli {
    /// Runtime REST endpoint, or several (the quorum's members, comma-separated: requests move on
    /// from one that is down or not the leader) (default: LATTICE_ENDPOINT, the config file,
    /// http://127.0.0.1:8080).
    #[arg(long, global = true)]
    endpoint: Option<String>,
    /// Output format: table (the default), wide, json or yaml — for every command (json and yaml
    /// print the API's answer).
    #[arg(short, long, global = true, value_enum)]
    output: Option<Output>,
    /// Tenant to submit as (default: LATTICE_TENANT or the config file); given here, it also selects
    /// what `nodes`, `dag list` and `audit` show.
    #[arg(short, long, global = true)]
    tenant: Option<String>,
    /// vCluster to submit to (default: the config file's `vcluster:`); given here, it also selects
    /// what `status` and `nodes` show.
    #[arg(long, global = true)]
    vcluster: Option<String>,
    /// Only what scripts need: ids (of what is listed, made or changed), no other text.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Each API request on stderr: method, URL, status and time taken.
    #[arg(short, long, global = true)]
    verbose: bool,
    /// The client's configuration file (default: ~/.config/lattice/config.yaml).
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<std::path::PathBuf>,
    /// No colors in tables (also: the NO_COLOR environment variable, or output that is not a
    /// terminal).
    #[arg(long, global = true)]
    no_color: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// (Parsed once per run: the size of its largest variant does not matter.)
#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Cmd {
    /// Submit an allocation: `lattice submit --nodes=2 --walltime=1h -- CMD ARGS` or
    /// `lattice submit job.sh` (directives in the script; flags override them). Prints its id.
    Submit(submit::SubmitArgs),
    /// Allocations (all of the tenant's, or one): `-o table|wide|json|yaml`, `--watch` to refresh.
    Status(status::StatusArgs),
    /// Cancel allocations (`--site`: ones forwarded to that peer).
    Cancel(status::CancelArgs),
    /// The output of an allocation's processes: from the log store (or the tail each node's agent
    /// reported when it ended); `--follow` streams it live while it runs.
    Logs(logs::LogsArgs),
    /// Run tasks within a running allocation (srun's counterpart): `lattice launch --alloc=ID -n 4
    /// [--tasks-per-node=K] [--env K=V] -- PROG ARGS`. The ranks get a PMI server (MPI without SSH or
    /// mpiexec) and the seed's rank environment; each rank's stdout and stderr are printed apart when
    /// the launch ends. Exits 0 when every rank did, else with the first failing rank's code.
    /// Inside an allocation `--alloc` defaults to it; a multi-node script calls it on node 0 only
    /// (on the others it returns 0 at once: node 0's launch already spans them).
    Launch(tasks::LaunchArgs),
    /// Slurm's `srun` inside an allocation, as `lattice launch` (`-n`, `--ntasks-per-node`,
    /// `--export`, `-l`, `--mpi`); the agents put an `srun` that calls this on the allocation's PATH.
    Srun(tasks::SrunArgs),
    /// A terminal inside a running allocation (its owner or an admin): a login shell on its first node
    /// (or `--node`), or `--command`. Keys, Ctrl-C and window sizes go through; exits with the remote
    /// exit status.
    Attach(interactive::AttachArgs),
    /// An interactive session: an allocation that holds its nodes until you leave. Waits for it to
    /// start, opens a terminal on its first node, and ends the allocation when the terminal ends.
    Session(interactive::SessionArgs),
    /// The nodes' image caches (warm and evict need the Operator role): `warm --image U [--nodes A,B |
    /// --group G] [--sticky]`, `list [--node N]`, `evict --image U [--nodes A,B | --group G]`.
    Cache {
        #[command(subcommand)]
        cmd: cache::CacheCmd,
    },
    /// Nodes and their state, and the vCluster and tenant of the allocation on each (`--state`,
    /// `--vcluster`, `--tenant` select); `lattice nodes NODE`: one node in full.
    Nodes(nodes::NodesArgs),
    /// DAGs of allocations: `submit FILE` (YAML or JSON: `allocations:` with `name` and `depends_on`),
    /// `status ID`, `list [--tenant T --user U --state S]`, `cancel ID`.
    Dag {
        #[command(subcommand)]
        cmd: dag::DagCmd,
    },
    /// Administration.
    Admin {
        #[command(subcommand)]
        cmd: admin::AdminCmd,
    },
    /// Follow an allocation until it ends: a line for each change of state (time, state, nodes,
    /// reason); exits 0 when it completed, 1 when it failed or was cancelled.
    Watch(monitor::WatchArgs),
    /// An allocation's metrics (from the TSDB): a snapshot of each metric's value and unit, or
    /// `--stream` for live values and alerts until it ends (the user guide's `lattice metrics`).
    Metrics(monitor::MetricsArgs),
    /// Why an allocation is where it is: what the scheduler's last pass found (dependencies, staging,
    /// quota, budget, energy window, topology, a reservation, the head of the queue), its place in
    /// its vCluster's queue, a refused start.
    /// With `--network` / `--storage` (or once it runs): the network diagnostics (nodes, dragonfly
    /// groups, network domain) and the storage ones (mounts, throughput against its QoS floor).
    #[command(alias = "diagnostics")]
    Diag(monitor::DiagArgs),
    /// Allocations' metrics side by side, aligned to each one's start (from the TSDB):
    /// `lattice compare ID ID [--metric gpu_utilization,io_write_bytes]`.
    Compare(monitor::CompareArgs),
    /// A live view of the cluster in the terminal: nodes by state, running allocations and the waiting
    /// ones with why they wait; refreshes every `--interval` seconds until Ctrl-C (`--once`: print once).
    /// `lattice top ID`: that allocation's metrics from the TSDB (`--per-node`, `--per-gpu`,
    /// `--duration 1h`).
    Top(monitor::TopArgs),
    /// Nodes: `list [--state S]`, `status NODE` (its state, allocation and health), and for the
    /// Operator role `drain [--urgent]|undrain|disable|enable NODE`.
    Node {
        #[command(subcommand)]
        cmd: nodes::NodeCmd,
    },
    /// The quorum's sensitive audit log, and whether its hash chain holds: `lattice audit [query]
    /// [--user U] [--alloc ID] [--node N] [--event claim,release] [--data-path P] [--tenant T]
    /// [--since D] [--until D]`.
    Audit(accounting::AuditArgs),
    /// Usage history (sacct): each allocation's node-hours and GPU-hours, and the totals, of a tenant
    /// (`--tenant`) or a user (`--user`) over the last `--days` (90).
    History(accounting::HistoryArgs),
    /// Usage totals (allocations, node-hours, GPU-hours) of a tenant (`--tenant`) or a user
    /// (`--user`, default yourself) over the last `--days` (90) or `--since`/`--until`.
    Usage(accounting::UsageArgs),
    /// Switch an allocation's telemetry mode: `lattice telemetry ID --mode debug --duration 30m`
    /// (prod | debug | audit; debug reverts to prod after its duration).
    Telemetry(monitor::TelemetryArgs),
    /// Log in to the server (OIDC): the IdP comes from the server's auth discovery; the device flow
    /// (open the address shown anywhere, enter the code) or the manual paste flow (open the address,
    /// sign in, paste back where the browser was sent); the token is cached for this server (0600).
    Login {
        /// `auto` (device when the IdP offers it, else manual), `device`, or `manual`; both work
        /// over SSH, with the browser on another machine.
        #[arg(long, value_enum, default_value = "auto")]
        flow: auth::Flow,
        /// OAuth scopes to ask for.
        #[arg(long, default_value = "openid offline_access")]
        scope: String,
        /// The server to log in to (`cluster.example.com` or a URL; default: the endpoint).
        #[arg(long)]
        server: Option<String>,
    },
    /// Forget this server's cached token and revoke it at the IdP (best effort).
    Logout {
        /// The server to log out of (default: the endpoint).
        #[arg(long)]
        server: Option<String>,
    },
    /// The client's effective configuration: each setting and where it comes from.
    Config,
    /// A shell completion script: `lattice completion bash > /etc/bash_completion.d/lattice`.
    Completion { shell: clap_complete::Shell },
}

/// User errors print `error: <message>` and their causes (exit 1), never a backtrace: those are for
/// panics. Usage errors are clap's (exit 2).
fn main() -> std::process::ExitCode {
    // A reader that stops early (`lattice node list | head -n 1`) ends us quietly, as it ends other
    // command-line tools, rather than with a panic about a broken pipe.
    // SAFETY: setting a signal's disposition to the default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
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
    let fc = file_config(cli.config.as_deref())?;
    let agent = http_agent(&fc)?;
    // One endpoint or several (a quorum's members, "A,B,C"): requests move on from a member that
    // is down or not the leader.
    let endpoints = cli
        .endpoint
        .clone()
        .or_else(|| std::env::var("LATTICE_ENDPOINT").ok())
        .or(fc.endpoint.clone())
        .or_else(|| fc.endpoints.as_ref().map(|e| e.join(",")))
        .map(|e| lattice_cli::client::http::endpoints(&e))
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| vec!["http://127.0.0.1:8080".into()]);
    let base = endpoints[0].clone();
    let tenant = cli
        .tenant
        .clone()
        .or_else(|| std::env::var("LATTICE_TENANT").ok())
        .or(fc.tenant);
    let default_vcluster = cli.vcluster.clone().or(fc.vcluster.clone());
    lattice_cli::client::set_color(
        !cli.no_color && std::env::var_os("NO_COLOR").is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()),
    );
    let store = lattice_cli::login::tokens_path().map(lattice_cli::login::Store::new);
    match &cli.cmd {
        Cmd::Login { flow, scope, server } => {
            return auth::login(&agent, &server_url(server.as_deref(), &base), store, scope, *flow);
        }
        Cmd::Logout { server } => return auth::logout(&agent, &server_url(server.as_deref(), &base), store),
        Cmd::Audit(a) if a.verb.as_deref() == Some("verify") => return accounting::verify(a),
        _ => {}
    }
    let client = match (std::env::var("LATTICE_TOKEN").ok().or(fc.token.clone()), store) {
        (Some(t), _) => Client::new(endpoints, agent, Some(t)),
        (None, Some(s)) => {
            // `lattice login`'s token: refreshed now when it is about to expire, and again when
            // the server ends a stream because it expired.
            let token = lattice_cli::login::token_for(&agent, &s, &base)?;
            let renew_agent = agent.clone();
            Client::new(endpoints, agent, token).with_renewal(Box::new(move || {
                lattice_cli::login::token_for(&renew_agent, &s, &base).ok().flatten()
            }))
        }
        (None, None) => Client::new(endpoints, agent, None),
    };
    let client = client.with_trace(cli.verbose);
    let output = match (cli.output, cli.quiet) {
        (Some(o), _) => o,
        (None, true) => Output::Quiet,
        (None, false) => Output::Table,
    };
    match cli.cmd {
        Cmd::Login { .. } | Cmd::Logout { .. } => unreachable!("handled above"),
        Cmd::Submit(args) => submit::run(&client, output, &tenant, (&cli.vcluster, &default_vcluster), args)?,
        Cmd::Status(args) => status::status(&client, output, &tenant, cli.vcluster.clone(), args)?,
        Cmd::Cancel(args) => status::cancel(&client, output, args)?,
        Cmd::Logs(args) => logs::run(&client, args)?,
        Cmd::Launch(args) => tasks::launch(&client, args)?,
        Cmd::Srun(args) => tasks::srun(&client, args)?,
        Cmd::Attach(args) => interactive::attach(&client, args)?,
        Cmd::Session(args) => interactive::session(&client, &tenant, &default_vcluster, args)?,
        Cmd::Cache { cmd } => cache::run(&client, output, cmd)?,
        Cmd::Nodes(args) => nodes::list(&client, output, cli.tenant.clone(), cli.vcluster.clone(), args)?,
        Cmd::Dag { cmd } => dag::run(&client, output, &tenant, cli.tenant.clone(), cmd)?,
        Cmd::Watch(args) => monitor::watch(&client, output, args)?,
        Cmd::Diag(args) => monitor::diag(&client, output, args)?,
        Cmd::Metrics(args) => monitor::metrics(&client, output, args)?,
        Cmd::Compare(args) => monitor::compare(&client, output, args)?,
        Cmd::Top(args) => monitor::top(&client, &tenant, args)?,
        Cmd::Node { cmd } => nodes::node(&client, output, cli.tenant.clone(), cli.vcluster.clone(), cmd)?,
        Cmd::Audit(args) => accounting::audit(&client, output, cli.tenant.clone(), args)?,
        Cmd::History(args) => accounting::history(&client, output, &tenant, args)?,
        Cmd::Usage(args) => accounting::usage(&client, output, cli.tenant.clone(), args)?,
        Cmd::Telemetry(args) => monitor::telemetry(&client, output, args)?,
        Cmd::Config => config::show(
            &client,
            &tenant,
            (cli.endpoint.is_some(), cli.tenant.is_some()),
            cli.config.as_deref(),
        )?,
        Cmd::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "lattice", &mut std::io::stdout());
        }
        Cmd::Admin { cmd } => admin::run(&client, output, &tenant, cmd)?,
    }
    Ok(())
}

/// `--server`: a URL as given, a bare host as `https://HOST`; none: the endpoint.
fn server_url(server: Option<&str>, base: &str) -> String {
    match server.map(str::trim).filter(|s| !s.is_empty()) {
        None => base.to_string(),
        Some(s) if s.contains("://") => s.trim_end_matches('/').to_string(),
        Some(s) => format!("https://{}", s.trim_end_matches('/')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_tree_is_consistent() {
        // Duplicate or conflicting argument names (a global flag a subcommand repeats) fail here.
        Cli::command().debug_assert();
    }

    #[test]
    fn the_books_forms_parse() {
        let cli = Cli::try_parse_from([
            "lattice",
            "-t",
            "physics",
            "--vcluster",
            "gpu",
            "-q",
            "status",
            "--count",
        ])
        .unwrap();
        assert_eq!(cli.tenant.as_deref(), Some("physics"));
        assert_eq!(cli.vcluster.as_deref(), Some("gpu"));
        assert!(cli.quiet);
        assert!(
            Cli::try_parse_from(["lattice", "-q", "-v", "status"]).is_err(),
            "quiet or verbose"
        );
        let Cmd::Attach(a) = Cli::try_parse_from(["lattice", "attach", "a-1", "--", "nvidia-smi", "-l", "1"])
            .unwrap()
            .cmd
        else {
            panic!("attach")
        };
        assert_eq!(a.argv, ["nvidia-smi", "-l", "1"]);
        let Cmd::Launch(l) = Cli::try_parse_from(["lattice", "launch", "--alloc=a-1", "--pty", "bash"])
            .unwrap()
            .cmd
        else {
            panic!("launch")
        };
        assert!(l.pty && l.command == ["bash"]);
        assert!(Cli::try_parse_from(["lattice", "launch", "--alloc=a-1", "--pty", "-n", "4", "bash"]).is_err());
        assert!(
            Cli::try_parse_from(["lattice", "cancel", "--state=pending"]).is_err(),
            "--state needs --all-mine"
        );
        assert!(Cli::try_parse_from(["lattice", "node", "drain", "n1", "--urgent"]).is_ok());
        assert!(Cli::try_parse_from(["lattice", "diagnostics", "a-1", "--network"]).is_ok());
        assert!(Cli::try_parse_from(["lattice", "metrics", "a-1", "--stream"]).is_ok());
        assert!(Cli::try_parse_from(["lattice", "login", "--server", "cluster.example.com"]).is_ok());
    }

    #[test]
    fn a_server_is_a_url_or_a_host() {
        assert_eq!(server_url(None, "http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(
            server_url(Some("cluster.example.com"), "x"),
            "https://cluster.example.com"
        );
        assert_eq!(server_url(Some("http://m1:8080/"), "x"), "http://m1:8080");
    }
}
