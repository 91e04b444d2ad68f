//! `lattice cache warm|list|evict`: the nodes' image caches.

use super::{Client, Output, print_value};
use anyhow::Result;
use clap::Subcommand;
use serde_json::json;

#[derive(Subcommand)]
pub enum CacheCmd {
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

/// `lattice cache ...`.
pub fn run(client: &Client, output: Output, cmd: CacheCmd) -> Result<()> {
    match cmd {
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
                Output::Quiet => {
                    for n in v["nodes"].as_object().into_iter().flat_map(|m| m.keys()) {
                        println!("{n}");
                    }
                }
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
    }
    Ok(())
}
