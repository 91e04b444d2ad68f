//! Standard Workload Format import (Parallel Workloads Archive), per DESIGN.md §3 "SWF import".
//!
//! Fields used (1-based): 1 job id, 2 submit, 4 run time, 5 allocated processors, 8 requested processors,
//! 9 requested time, 11 status, 12 user, 13 group, 15 queue. `-1` means missing. `.gz` input is
//! decompressed transparently.

use crate::error::{Problem, TraceError};
use crate::workload::{TraceJob, Workload};
use lattice_engine::{AllocSpec, Duration, TenantId, Time, VClusterId};
use std::io::Read;
use std::path::Path;

/// Which SWF field names the tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TenantField {
    /// Field 12, user id → tenant `u<id>`.
    #[default]
    User,
    /// Field 13, group id → tenant `g<id>`.
    Group,
}

/// Import options.
#[derive(Clone, Debug)]
pub struct SwfOptions {
    /// Processors per node: job nodes = ceil(processors / procs_per_node).
    pub procs_per_node: u32,
    pub tenant_field: TenantField,
    /// Map field 15 (queue) to vCluster `q<id>`; otherwise every job goes to vCluster `default`.
    pub vcluster_by_queue: bool,
    /// Cluster size in nodes when an inventory is given (overrides the header).
    pub cluster_nodes: Option<u32>,
    /// Read the trace as pyss does: run time = min(run, requested); drop run <= 0 or requested <= 0.
    pub pyss: bool,
}

impl Default for SwfOptions {
    fn default() -> Self {
        SwfOptions {
            procs_per_node: 1,
            tenant_field: TenantField::User,
            vcluster_by_queue: false,
            cluster_nodes: None,
            pyss: false,
        }
    }
}

/// Reads an SWF file (plain or `.gz`).
pub fn read_swf(path: &Path, opts: &SwfOptions) -> Result<Workload, TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    let text = decode(bytes).map_err(|e| TraceError::io(path, e))?;
    let name = path.display().to_string();
    Ok(parse_swf(&name, &text, opts))
}

/// Decompresses gzip input (detected by its magic bytes) and checks UTF-8 leniently.
pub fn decode(bytes: Vec<u8>) -> std::io::Result<String> {
    let owned = |raw: Vec<u8>| match String::from_utf8(raw) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::with_capacity(bytes.len() * 6);
        flate2::read::MultiGzDecoder::new(&bytes[..]).read_to_end(&mut raw)?;
        Ok(owned(raw))
    } else {
        Ok(owned(bytes))
    }
}

const FIELD_NAMES: [&str; 18] = [
    "job_number",
    "submit_time",
    "wait_time",
    "run_time",
    "allocated_processors",
    "average_cpu_time",
    "used_memory",
    "requested_processors",
    "requested_time",
    "requested_memory",
    "status",
    "user_id",
    "group_id",
    "executable",
    "queue",
    "partition",
    "preceding_job",
    "think_time",
];

/// Parses SWF text. Never fails: bad lines are skipped and counted by reason.
pub fn parse_swf(file: &str, text: &str, opts: &SwfOptions) -> Workload {
    parse_swf_with(file, text, opts, false)
}

/// [`parse_swf`], optionally keeping every problem.
pub fn parse_swf_with(file: &str, text: &str, opts: &SwfOptions, keep_all_problems: bool) -> Workload {
    let mut w = Workload {
        source: file.to_string(),
        keep_all_problems,
        ..Workload::default()
    };
    let ppn = opts.procs_per_node.max(1);
    let (mut max_nodes, mut max_procs) = (None::<u32>, None::<u32>);
    let mut header_done = false;
    let mut cluster = opts.cluster_nodes;
    let default_vc = w.vclusters.intern("default");
    let mut fields = [0i64; 18];
    let mut specs: std::collections::BTreeMap<(u32, u32, u32, u32, i64), std::sync::Arc<AllocSpec>> =
        std::collections::BTreeMap::new();
    for (ln, line) in text.lines().enumerate() {
        let line_no = ln as u64 + 1;
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(h) = t.strip_prefix(';') {
            if let Some((k, v)) = h.split_once(':') {
                let v = v.trim().parse::<u32>().ok();
                match k.trim() {
                    "MaxNodes" => max_nodes = v,
                    "MaxProcs" => max_procs = v,
                    _ => {}
                }
            }
            continue;
        }
        if !header_done {
            header_done = true;
            if cluster.is_none() {
                cluster = match (max_procs, max_nodes) {
                    (Some(p), _) if p > 0 => Some(p / ppn),
                    (_, Some(n)) if n > 0 => Some(n),
                    _ => None,
                };
            }
        }
        let problem = |field: Option<usize>, reason: &str, message: String| Problem {
            file: file.to_string(),
            line: line_no,
            field: field.map(|f| FIELD_NAMES[f].to_string()),
            reason: reason.to_string(),
            message,
        };
        let mut n = 0;
        let mut bad = None;
        for (i, tok) in t.split_ascii_whitespace().enumerate() {
            if i >= 18 {
                n = 19;
                break;
            }
            match parse_num(tok) {
                Some(v) => fields[i] = v,
                None => {
                    bad.get_or_insert((i, tok.to_string()));
                }
            }
            n = i + 1;
        }
        if n != 18 {
            w.skip(problem(
                None,
                "malformed_line",
                format!(
                    "expected 18 whitespace-separated fields, found {}",
                    t.split_ascii_whitespace().count()
                ),
            ));
            continue;
        }
        if let Some((i, tok)) = bad {
            w.skip(problem(Some(i), "malformed_line", format!("`{tok}` is not a number")));
            continue;
        }
        let [
            id,
            submit,
            _,
            run,
            alloc_procs,
            _,
            _,
            req_procs,
            req_time,
            _,
            status,
            user,
            group,
            _,
            queue,
            ..,
        ] = fields;
        if submit < 0 {
            w.skip(problem(
                Some(1),
                "submit_negative",
                format!("submit time {submit} is missing or negative"),
            ));
            continue;
        }
        if run < 0 {
            w.skip(problem(
                Some(3),
                "runtime_negative",
                format!("run time {run} is missing or negative"),
            ));
            continue;
        }
        // Times beyond 100 years cannot be a job's: refused rather than saturated in the arithmetic.
        let max_s = (crate::duration::MAX_DURATION.0 / 1000) as i64;
        if let Some((f, v)) = [(1, submit), (3, run), (8, req_time)]
            .into_iter()
            .find(|(_, v)| *v > max_s)
        {
            w.skip(problem(
                Some(f),
                "time_out_of_range",
                format!("{v} s is longer than 100 years"),
            ));
            continue;
        }
        let procs = if req_procs > 0 { req_procs } else { alloc_procs };
        if procs <= 0 {
            w.skip(problem(
                Some(7),
                "nodes_nonpositive",
                format!("requested ({req_procs}) and allocated ({alloc_procs}) processors are both missing or <= 0"),
            ));
            continue;
        }
        let nodes = (procs as u64).div_ceil(ppn as u64).min(u32::MAX as u64) as u32;
        if let Some(c) = cluster
            && nodes > c
        {
            w.skip(problem(
                Some(7),
                "exceeds_cluster",
                format!("needs {nodes} nodes but the cluster has {c}"),
            ));
            continue;
        }
        let mut runtime = run;
        let walltime = if req_time > 0 { req_time } else { run };
        if opts.pyss {
            if run <= 0 {
                w.skip(problem(
                    Some(3),
                    "pyss_runtime_nonpositive",
                    format!("pyss drops run time {run} <= 0"),
                ));
                continue;
            }
            if req_time <= 0 {
                w.skip(problem(
                    Some(8),
                    "pyss_requested_nonpositive",
                    format!("pyss drops requested time {req_time} <= 0"),
                ));
                continue;
            }
            runtime = run.min(req_time);
        }
        let tenant = match opts.tenant_field {
            TenantField::User => w.tenants.intern(&owner_name('u', user)),
            TenantField::Group => w.tenants.intern(&owner_name('g', group)),
        };
        let tenant_name = w.tenants.get(tenant).unwrap_or_default().to_string();
        let project = w.intern_project(&tenant_name, "default");
        let vcluster = if opts.vcluster_by_queue {
            w.vclusters.intern(&owner_name('q', queue))
        } else {
            default_vc
        };
        // Jobs asking for the same share one request: a year of a site's jobs has far fewer distinct
        // requests (owner, size, walltime) than jobs, and the replay's engine shares them too.
        let spec = specs
            .entry((tenant, project.0, vcluster, nodes, walltime))
            .or_insert_with(|| {
                let mut spec = AllocSpec::simple(
                    TenantId(tenant),
                    VClusterId(vcluster),
                    nodes,
                    Duration::from_secs(walltime as u64),
                );
                spec.project = project;
                std::sync::Arc::new(spec)
            })
            .clone();
        w.jobs.push(TraceJob {
            id: id.to_string(),
            submit: Time::from_secs(submit as u64),
            runtime: Some(Duration::from_secs(runtime as u64)),
            // SWF status 1 = completed; 0 = failed, 5 = cancelled; -1/others: unknown, treated as success.
            exit_ok: !matches!(status, 0 | 5),
            spec,
            deps: Vec::new(),
            line: line_no,
            names: None,
        });
    }
    w.cluster_nodes = cluster;
    w.sort_by_submit();
    // A year of jobs grows the list by doubling: give back the slack (up to half its size).
    w.jobs.shrink_to_fit();
    w
}

fn owner_name(prefix: char, id: i64) -> String {
    if id < 0 {
        "unknown".to_string()
    } else {
        format!("{prefix}{id}")
    }
}

/// Integer fields; a few archive files write fractional values (e.g. `12.5`), which are truncated.
fn parse_num(tok: &str) -> Option<i64> {
    tok.parse::<i64>().ok().or_else(|| {
        let f = tok.parse::<f64>().ok()?;
        f.is_finite().then_some(f as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "; MaxNodes: 8\n; MaxProcs: 8\n";

    fn line(id: i64, submit: i64, run: i64, procs: i64, req: i64) -> String {
        format!("{id} {submit} 0 {run} {procs} -1 -1 {procs} {req} -1 1 3 7 -1 2 -1 -1 -1\n")
    }

    #[test]
    fn parses_fields_and_header() {
        let text = format!("{HEADER}{}{}", line(1, 0, 10, 2, 20), line(2, 5, 0, 8, -1));
        let w = parse_swf("t.swf", &text, &SwfOptions::default());
        assert_eq!(w.cluster_nodes, Some(8));
        assert_eq!(w.jobs.len(), 2);
        let j = &w.jobs[0];
        assert_eq!(j.id, "1");
        assert_eq!(j.runtime, Some(Duration::from_secs(10)));
        assert_eq!(j.spec.lifecycle.walltime(), Some(Duration::from_secs(20)));
        assert_eq!(w.tenants.get(j.spec.tenant.0), Some("u3"));
        // Runtime 0 is kept; missing walltime falls back to the runtime.
        assert_eq!(w.jobs[1].runtime, Some(Duration::ZERO));
        assert_eq!(w.jobs[1].spec.lifecycle.walltime(), Some(Duration::ZERO));
    }

    #[test]
    fn skips_are_counted_by_reason_with_line_and_field() {
        let text = format!(
            "{HEADER}{}{}{}{}{}",
            line(1, 0, -1, 2, 20),
            line(2, 0, 10, -1, 20),
            line(3, 0, 10, 9, 20),
            "4 0 x 10 2 -1 -1 2 20 -1 1 3 7 -1 2 -1 -1 -1\n",
            "5 0 10\n"
        );
        let w = parse_swf("t.swf", &text, &SwfOptions::default());
        assert!(w.jobs.is_empty());
        assert_eq!(w.skipped.get("runtime_negative"), Some(&1));
        assert_eq!(w.skipped.get("nodes_nonpositive"), Some(&1));
        assert_eq!(w.skipped.get("exceeds_cluster"), Some(&1));
        assert_eq!(w.skipped.get("malformed_line"), Some(&2));
        let p = &w.problems[3];
        assert_eq!((p.line, p.field.as_deref()), (6, Some("wait_time")));
        assert!(p.to_string().starts_with("t.swf:6: field `wait_time`"), "{p}");
    }

    #[test]
    fn times_beyond_a_century_are_skipped_naming_the_field() {
        let text = format!(
            "{HEADER}{}{}{}{}",
            "1 99999999999999 -1 10 2 -1 -1 2 20 -1 1 3 7 -1 2 -1 -1 -1\n",
            "2 0 -1 9223372036854775807 2 -1 -1 2 20 -1 1 3 7 -1 2 -1 -1 -1\n",
            "3 0 -1 10 2 -1 -1 2 99999999999999 -1 1 3 7 -1 2 -1 -1 -1\n",
            line(4, 0, 10, 2, 20),
        );
        let w = parse_swf("t.swf", &text, &SwfOptions::default());
        assert_eq!(w.jobs.len(), 1);
        assert_eq!(w.skipped.get("time_out_of_range"), Some(&3));
        let fields: Vec<_> = w.problems.iter().map(|p| p.field.clone().unwrap_or_default()).collect();
        assert_eq!(fields, ["submit_time", "run_time", "requested_time"]);
    }

    #[test]
    fn procs_per_node_rounds_up_and_options_map_names() {
        let text = format!("; MaxProcs: 16\n{}", line(1, 0, 10, 5, 20));
        let opts = SwfOptions {
            procs_per_node: 4,
            tenant_field: TenantField::Group,
            vcluster_by_queue: true,
            ..SwfOptions::default()
        };
        let w = parse_swf("t.swf", &text, &opts);
        assert_eq!(w.cluster_nodes, Some(4));
        assert_eq!(w.jobs[0].spec.nodes.min, 2);
        assert_eq!(w.tenants.get(w.jobs[0].spec.tenant.0), Some("g7"));
        assert_eq!(w.vclusters.get(w.jobs[0].spec.vcluster.0), Some("q2"));
    }

    #[test]
    fn pyss_reading_clamps_and_drops() {
        let text = format!(
            "{HEADER}{}{}{}",
            line(1, 0, 30, 2, 20),
            line(2, 0, 0, 2, 20),
            line(3, 0, 5, 2, -1)
        );
        let opts = SwfOptions {
            pyss: true,
            ..SwfOptions::default()
        };
        let w = parse_swf("t.swf", &text, &opts);
        assert_eq!(w.jobs.len(), 1);
        assert_eq!(w.jobs[0].runtime, Some(Duration::from_secs(20)));
        assert_eq!(w.skipped.get("pyss_runtime_nonpositive"), Some(&1));
        assert_eq!(w.skipped.get("pyss_requested_nonpositive"), Some(&1));
    }

    #[test]
    fn unsorted_input_is_sorted_stably_and_noted() {
        let text = format!(
            "{HEADER}{}{}{}",
            line(1, 50, 1, 1, 1),
            line(2, 10, 1, 1, 1),
            line(3, 10, 1, 1, 1)
        );
        let w = parse_swf("t.swf", &text, &SwfOptions::default());
        let ids: Vec<&str> = w.jobs.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(ids, ["2", "3", "1"]);
        assert_eq!(w.notes.len(), 1);
    }

    #[test]
    fn gzip_is_detected() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"; MaxProcs: 4\n").unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(decode(gz).unwrap(), "; MaxProcs: 4\n");
    }
}
