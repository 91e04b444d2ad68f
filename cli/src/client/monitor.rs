//! Following and inspecting allocations: `lattice watch`, `metrics`, `diag`, `compare`, `top` and
//! `telemetry`.

use super::{Client, Output, print_value, query};
use anyhow::{Result, bail};
use serde_json::json;

#[derive(clap::Args)]
pub struct WatchArgs {
    pub id: String,
    /// The live metrics instead (all, or these, comma-separated): a line per period of its
    /// telemetry mode (30 s prod, 1 s debug), from the TSDB.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    pub metrics: Option<String>,
    /// Only the alerts of the live metrics stream.
    #[arg(long)]
    pub alerts_only: bool,
    /// Seconds between looks.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
}

#[derive(clap::Args)]
pub struct MetricsArgs {
    pub id: String,
    /// Live values (and alerts) every period of its telemetry mode until it ends.
    #[arg(long)]
    pub stream: bool,
    /// Only these metrics (comma-separated; default: all).
    #[arg(long)]
    pub metric: Option<String>,
    /// Per node (`--per-gpu`: per GPU) instead of the allocation's summary.
    #[arg(long, conflicts_with = "stream")]
    pub per_node: bool,
    #[arg(long, conflicts_with = "stream")]
    pub per_gpu: bool,
    /// The window (default 5m).
    #[arg(long, conflicts_with = "stream")]
    pub duration: Option<String>,
}

#[derive(clap::Args)]
pub struct DiagArgs {
    pub id: String,
    #[arg(long)]
    pub network: bool,
    #[arg(long)]
    pub storage: bool,
}

#[derive(clap::Args)]
pub struct CompareArgs {
    #[arg(required = true, num_args = 1..)]
    pub ids: Vec<String>,
    /// Comma-separated metrics (default: all).
    #[arg(long)]
    pub metric: Option<String>,
    /// `relative` (from each start) or `absolute` (unix seconds).
    #[arg(long, default_value = "relative")]
    pub align: String,
    /// Seconds between points, e.g. `5s`.
    #[arg(long)]
    pub step: Option<String>,
}

#[derive(clap::Args)]
pub struct TopArgs {
    /// One allocation's metrics instead of the cluster view.
    pub id: Option<String>,
    #[arg(long)]
    pub per_node: bool,
    #[arg(long)]
    pub per_gpu: bool,
    /// Every metric, per node.
    #[arg(long)]
    pub wide: bool,
    /// The window (default 5m).
    #[arg(long)]
    pub duration: Option<String>,
    #[arg(long, default_value_t = 2.0)]
    pub interval: f64,
    #[arg(long)]
    pub once: bool,
    /// Every tenant's allocations (default: the configured tenant's).
    #[arg(long)]
    pub all: bool,
}

#[derive(clap::Args)]
pub struct TelemetryArgs {
    pub id: String,
    #[arg(long)]
    pub mode: String,
    #[arg(long)]
    pub duration: Option<String>,
}

/// `lattice watch ID`: exits 0 when the allocation completed, 1 when it failed or was cancelled.
pub fn watch(client: &Client, output: Output, args: WatchArgs) -> Result<()> {
    match args {
        WatchArgs {
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
            // The server ends the stream when its token expires: with a fresh one it is opened
            // again (a live stream: nothing to resume from).
            let mut expired = true;
            // Renewals in a row of streams ended at once (a token the server ends at once must
            // not loop), as `logs --follow` bounds them.
            let mut renewals = 0;
            while std::mem::take(&mut expired) {
                let token = client.token();
                let opened = std::time::Instant::now();
                client.events(&path, |event, data| {
                    let text = match (event, output) {
                        ("end", _) => {
                            state = data["state"].as_str().unwrap_or_default().to_string();
                            None
                        }
                        ("error", _)
                            if data["error"] == "token expired"
                                && (renewals < 3 || opened.elapsed() >= std::time::Duration::from_secs(1))
                                && client.renew_token(token.as_deref()) =>
                        {
                            renewals = if opened.elapsed() >= std::time::Duration::from_secs(1) {
                                1
                            } else {
                                renewals + 1
                            };
                            expired = true;
                            return false;
                        }
                        (_, Output::Json) => Some(json!({"event": event, "data": data}).to_string()),
                        ("metrics", _) if alerts_only => None,
                        ("metrics", _) => Some(crate::observe::metrics_line(data)),
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
            }
            if state.is_empty() {
                bail!("{id}: the metrics stream closed before the allocation ended");
            }
            eprintln!("{id}: {state}");
            if state != "completed" {
                std::process::exit(1);
            }
        }
        WatchArgs { id, interval, .. } => {
            let mut last: Option<String> = None;
            loop {
                let v = client.call("GET", &format!("/v1/allocations/{id}"), None)?;
                let state = v["state"].as_str().unwrap_or_default().to_string();
                if last.as_deref() != Some(state.as_str()) {
                    // json/yaml: one document per change (JSON lines; YAML documents).
                    match output {
                        Output::Json => println!("{}", serde_json::to_string(&v)?),
                        Output::Yaml => print!("---\n{}", yaml_serde::to_string(&v)?),
                        _ => println!("{}", crate::status::watch_line(&v, crate::status::now_ms())),
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
    }
    Ok(())
}

/// `lattice diag ID`.
pub fn diag(client: &Client, output: Output, args: DiagArgs) -> Result<()> {
    let DiagArgs { id, network, storage } = args;
    let part = match (network, storage) {
        (true, false) => "/network",
        (false, true) => "/storage",
        _ => "",
    };
    if network || storage {
        let d = client.call("GET", &format!("/v1/allocations/{id}/diagnostics{part}"), None)?;
        return print_value(&d, output, crate::observe::diagnostics_view);
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
        let mut text = crate::status::diagnose(&v, q.as_ref());
        if let Some(d) = &d {
            text.push_str(&crate::observe::diagnostics_view(d));
        }
        text
    })?;
    Ok(())
}

/// `lattice compare ID ID...`.
pub fn compare(client: &Client, output: Output, args: CompareArgs) -> Result<()> {
    let CompareArgs {
        ids,
        metric,
        align,
        step,
    } = args;
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
    print_value(&v, output, crate::observe::compare_view)?;
    Ok(())
}

/// `lattice top [ID]`.
pub fn top(client: &Client, tenant: &Option<String>, args: TopArgs) -> Result<()> {
    match args {
        TopArgs {
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
            print!("{}", crate::observe::metrics_view(&v));
        }
        TopArgs {
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
            let rows = crate::terminal::size().map_or(40, |(r, _)| (r as usize).saturating_sub(6).max(5));
            let screen = crate::status::top_screen(&allocs, &nodes, crate::status::now_ms(), rows);
            if once {
                print!("{screen}");
                break;
            }
            // Home, clear, the screen.
            print!("\x1b[H\x1b[2J{screen}");
            std::io::Write::flush(&mut std::io::stdout())?;
            std::thread::sleep(std::time::Duration::from_secs_f64(interval.clamp(0.1, 3600.0)));
        },
    }
    Ok(())
}

/// `lattice telemetry ID --mode M`.
pub fn telemetry(client: &Client, output: Output, args: TelemetryArgs) -> Result<()> {
    let TelemetryArgs { id, mode, duration } = args;
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
    Ok(())
}

/// `lattice metrics ID [--stream]`: the snapshot (as `lattice top ID`), or the live stream (as
/// `lattice watch ID --metrics`).
pub fn metrics(client: &Client, output: Output, args: MetricsArgs) -> Result<()> {
    let MetricsArgs {
        id,
        stream,
        metric,
        per_node,
        per_gpu,
        duration,
    } = args;
    if stream {
        let w = WatchArgs {
            id,
            metrics: Some(metric.unwrap_or_default()),
            alerts_only: false,
            interval: 1.0,
        };
        return watch(client, output, w);
    }
    let mode = match (per_node, per_gpu) {
        (_, true) => "per-gpu",
        (true, false) => "per-node",
        _ => "summary",
    };
    let path = format!(
        "/v1/allocations/{id}/metrics{}",
        query(&[
            ("mode", &Some(mode.to_string())),
            ("duration", &duration),
            ("metrics", &metric)
        ])
    );
    let v = client.call("GET", &path, None)?;
    print_value(&v, output, crate::observe::metrics_view)
}
