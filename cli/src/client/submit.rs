//! `lattice submit`: an allocation from flags, or from a script's `#LATTICE`/`#SBATCH` directives.

use super::{Client, Output, print_value};
use crate::directives::{SubmitFields, parse_script};
use anyhow::{Context, Result, bail};
use serde_json::json;

#[derive(clap::Args)]
pub struct SubmitArgs {
    #[arg(long)]
    pub nodes: Option<u32>,
    #[arg(long)]
    pub walltime: Option<String>,
    #[arg(long)]
    pub vcluster: Option<String>,
    #[arg(long)]
    pub preemption_class: Option<i64>,
    #[arg(long)]
    pub gpu_type: Option<String>,
    #[arg(long)]
    pub gpus: Option<u32>,
    #[arg(long)]
    pub constraint: Vec<String>,
    #[arg(long)]
    pub name: Option<String>,
    /// Simulated agents only: how long the run takes.
    #[arg(long)]
    pub duration: Option<String>,
    /// A task group (job array): `0-99%20` = indices 0..99, at most 20 running at once
    /// (`$LATTICE_TASK_INDEX` in each; `${INDEX}` in the command is replaced by it).
    #[arg(long, value_parser = crate::directives::TaskGroupSpec::parse)]
    pub task_group: Option<crate::directives::TaskGroupSpec>,
    /// The software environment: a uenv, `name/version:tag` (mounted at /user-environment for the
    /// job's processes).
    #[arg(long)]
    pub uenv: Option<String>,
    /// The uenv view to activate (its environment variables).
    #[arg(long)]
    pub view: Option<String>,
    /// An OCI image instead of a uenv, `NAME[:TAG]` from the nodes' image store (a container).
    #[arg(long)]
    pub image: Option<String>,
    /// A data mount, `SOURCE:TARGET[:ro]` (`s3://bucket/dataset:/data`), repeatable: the agents
    /// mount it from the site's storage for the job's processes alone.
    #[arg(long = "data-mount", value_parser = crate::directives::DataMountSpec::parse)]
    pub data_mount: Vec<crate::directives::DataMountSpec>,
    /// Start only after these end: `ID:success|failure|any,...` (`#SBATCH --dependency=afterok:ID`).
    #[arg(long = "depends-on")]
    pub depends_on: Option<String>,
    /// Federation: run it at this peer site, or `auto` (the federation broker picks by data
    /// gravity, capacity, energy price and authorization; sensitive work never leaves). Prints
    /// `SITE/ID` when it went elsewhere.
    #[arg(long)]
    pub site: Option<String>,
    /// A batch script (its directives are read), or the command after `--`.
    #[arg(trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// `lattice submit`: prints the new allocation's id (`SITE/ID` when it went to a peer site).
pub fn run(
    client: &Client,
    output: Output,
    tenant: &Option<String>,
    default_vcluster: &Option<String>,
    args: SubmitArgs,
) -> Result<()> {
    let SubmitArgs {
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
    } = args;
    // A script file: its directives, then the flags on top.
    let mut fields = SubmitFields::default();
    // Quoted for `/bin/sh -c`: the job runs exactly the arguments typed after `--`.
    let mut entrypoint = crate::directives::shell_join(&command);
    if let [script] = command.as_slice()
        && std::path::Path::new(script).is_file()
    {
        let text = std::fs::read_to_string(script).with_context(|| format!("reading {script}"))?;
        let (f, warnings) = parse_script(&text);
        for w in warnings {
            eprintln!("{w}");
        }
        fields = f;
        entrypoint = format!("bash {}", crate::directives::shell_join(&[script]));
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
            Some(d) => crate::directives::parse_depends_on(d).map_err(anyhow::Error::msg)?,
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
        print_value(&v, output, crate::observe::federated_submit)?;
        return Ok(());
    }
    let v = client.call("POST", "/v1/allocations", Some(&body))?;
    print_value(&v, output, |v| format!("{}\n", v["id"].as_str().unwrap_or_default()))?;
    Ok(())
}
