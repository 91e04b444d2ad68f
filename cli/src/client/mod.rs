//! The `lattice` client's commands, one module per command group of its command tree: `bin/lattice.rs`
//! parses the command line and dispatches to them. [`http`] is the REST client, [`config`] the client's
//! configuration (and `lattice config`); the output helpers they share are here.

pub mod accounting;
pub mod admin;
pub mod auth;
pub mod cache;
pub mod config;
pub mod dag;
pub mod http;
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

pub use http::Client;

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

/// `?k=v&...` of the given (set) parameters, percent-encoded.
pub fn query(params: &[(&str, &Option<String>)]) -> String {
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

/// Prints rows as a table (chosen columns), wide (more columns), JSON or YAML.
pub fn print_rows(rows: &[Value], output: Output, single: bool, kind: &str) -> Result<()> {
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
            print!("{}", crate::observe::table(cols, &table));
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
