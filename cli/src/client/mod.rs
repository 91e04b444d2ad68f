//! The `lattice` client's commands, one module per command group of its command tree: `bin/lattice.rs`
//! parses the command line and dispatches to them. The REST client is the `lattice-client` crate's
//! ([`Client`], its transport as [`http`]); [`config`] is the client's configuration (and
//! `lattice config`); the output helpers they share are here.

pub mod accounting;
pub mod admin;
pub mod auth;
pub mod cache;
pub mod config;
pub mod dag;
pub mod interactive;
pub mod logs;
pub mod monitor;
pub mod nodes;
pub mod status;
pub mod submit;
pub mod tasks;
pub mod vcluster;

use anyhow::Result;
use clap::ValueEnum;
use serde_json::Value;

pub use lattice_client::Client;
pub use lattice_client::api::query;
pub use lattice_client::transport as http;

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
    /// `lattice -q`: only the ids of what is listed, made or changed.
    #[value(skip)]
    Quiet,
}

/// Whether tables color their rows by state (`--no-color`, `NO_COLOR`, or output that is not a
/// terminal: no).
static COLOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_color(on: bool) {
    COLOR.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The ANSI color of a row in this state: failures red, waiting yellow, running green.
fn state_color(state: &str) -> Option<&'static str> {
    match state {
        "failed" | "cancelled" | "down" | "timeout" | "node_fail" => Some("31"),
        "pending" | "queued" | "draining" | "drained" | "suspended" | "booting" => Some("33"),
        "running" | "ready" | "completed" => Some("32"),
        _ => None,
    }
}

/// A table's lines after its header, each colored by its row's state.
fn colored(table: &str, rows: &[Value]) -> String {
    let mut out = String::new();
    for (i, line) in table.lines().enumerate() {
        let color = i
            .checked_sub(1)
            .and_then(|r| rows.get(r))
            .and_then(|r| state_color(r["state"].as_str().unwrap_or_default()));
        match color {
            Some(c) => out.push_str(&format!("\x1b[{c}m{line}\x1b[0m\n")),
            None => out.push_str(&format!("{line}\n")),
        }
    }
    out
}

/// What `-q` prints of a row or an answer: its id (or name).
fn id_of(v: &Value) -> Option<&str> {
    ["id", "name", "session_id", "node"].iter().find_map(|k| v[*k].as_str())
}

/// Prints rows as a table (chosen columns), wide (more columns), JSON or YAML.
pub fn print_rows(rows: &[Value], output: Output, single: bool, kind: &str) -> Result<()> {
    match output {
        Output::Quiet => {
            for id in rows.iter().filter_map(id_of) {
                println!("{id}");
            }
        }
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
            let text = crate::observe::table(cols, &table);
            if COLOR.load(std::sync::atomic::Ordering::Relaxed) {
                print!("{}", colored(&text, rows));
            } else {
                print!("{text}");
            }
        }
    }
    Ok(())
}

/// An answer as JSON or YAML, or as `text` renders it for the table formats.
pub fn print_value(v: &Value, output: Output, text: impl FnOnce(&Value) -> String) -> Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(v)?),
        Output::Yaml => print!("{}", yaml_serde::to_string(v)?),
        Output::Table | Output::Wide => print!("{}", text(v)),
        Output::Quiet => {
            if let Some(id) = id_of(v) {
                println!("{id}");
            }
        }
    }
    Ok(())
}

/// Writes a job's output to our stdout, or to our stderr when it is the job's stderr.
pub fn print_stream(to_stderr: bool, text: &str) {
    if to_stderr {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
}
