//! Imports of real site data into the JSONL event log, and anonymisation of traces for sharing.
//!
//! - [`sacct`]: Slurm accounting dumps (`sacct --parsable2 --allusers --format=JobID,User,Account,
//!   Partition,QOS,Submit,Start,End,Elapsed,Timelimit,NNodes,AllocTRES,State,ExitCode,Priority`). Columns
//!   are found by their header names (any order; unknown columns are ignored). Job steps (`123.batch`,
//!   `123.0`) are folded into their job, array elements (`123_4`) and het-job components (`123+1`)
//!   become allocations of their own; jobs that never started (pending, cancelled before start) or are
//!   still running are skipped and counted. Mapping per the Slurm migration chapter: account → tenant,
//!   partition → vCluster (only with a `partition_mapping`), QOS → preemption class (`qos_mapping`,
//!   default low 1, normal 4, high 7, urgent 9), `gres/gpu[:type]=N` of AllocTRES → GPU constraints.
//! - [`alibaba`]: the Alibaba GPU-cluster pod list (`openb_pod_list_*.csv`): one single-node allocation per
//!   scheduled pod with its GPU count, GPU model, CPU and memory as constraints.
//! - [`workload_to_jsonl`]: any [`Workload`] (e.g. an SWF import) as JSONL.
//! - [`anonymise_jsonl`], [`anonymise_swf`]: stable keyed pseudonyms for users, accounts (tenants),
//!   projects and partitions (vClusters).
//!
//! Every skipped line is counted by reason and kept as a [`Problem`] naming file, line and field.

use crate::error::{Problem, TraceError};
use crate::workload::Workload;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// A submit (time, allocation) and, for a failed run, its completion (id, run time, exit code).
type Submit = (i64, Value, Option<(String, f64, i64)>);

/// The result of an import: the JSONL text and an account of every line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imported {
    pub jsonl: String,
    /// Data lines read (not counting the header and comments).
    pub lines: u64,
    /// Allocations written.
    pub allocations: u64,
    /// Lines not imported, by reason (`job_step`, `not_started`, ...).
    pub skipped: BTreeMap<String, u64>,
    /// The first problems per reason, with file, line and field.
    pub problems: Vec<Problem>,
    /// How fields were interpreted (defaults taken, mappings applied).
    pub notes: Vec<String>,
}

impl Imported {
    fn skip(&mut self, p: Problem) {
        let n = self.skipped.entry(p.reason.clone()).or_insert(0);
        *n += 1;
        if *n <= 20 {
            self.problems.push(p);
        }
    }

    /// A one-paragraph account: lines, allocations, skipped by reason.
    pub fn summary(&self) -> String {
        let skipped: Vec<String> = self.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!(
            "{} lines read, {} allocations written, {} skipped{}",
            self.lines,
            self.allocations,
            self.skipped.values().sum::<u64>(),
            if skipped.is_empty() {
                String::new()
            } else {
                format!(" ({})", skipped.join(", "))
            }
        )
    }
}

/// Site mappings for the Slurm import (`lattice-compat.yaml` of the migration chapter).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompatMapping {
    #[serde(default)]
    pub partition_mapping: BTreeMap<String, String>,
    #[serde(default = "default_qos")]
    pub qos_mapping: BTreeMap<String, u8>,
}

fn default_qos() -> BTreeMap<String, u8> {
    [("low", 1), ("normal", 4), ("high", 7), ("urgent", 9)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

impl Default for CompatMapping {
    fn default() -> Self {
        CompatMapping {
            partition_mapping: BTreeMap::new(),
            qos_mapping: default_qos(),
        }
    }
}

/// Reads a `lattice-compat.yaml` (partition and QOS mappings).
pub fn read_compat(path: &Path) -> Result<CompatMapping, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::io(path, e))?;
    let m: CompatMapping = yaml_serde::from_str(&text).map_err(|e| TraceError::Config {
        file: path.display().to_string(),
        message: e.to_string(),
    })?;
    if let Some((q, c)) = m.qos_mapping.iter().find(|(_, c)| **c > 10) {
        return Err(TraceError::Config {
            file: path.display().to_string(),
            message: format!("qos_mapping.{q}: preemption class {c} is out of range 0-10"),
        });
    }
    Ok(m)
}

/// Seconds since the Unix epoch of a Slurm timestamp `YYYY-MM-DDTHH:MM:SS` (site local time, taken as
/// is: only differences matter for a replay).
pub fn parse_slurm_time(s: &str) -> Option<i64> {
    let (date, time) = s.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let t: Vec<i64> = time.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let (&[y, m, day], &[hh, mm, ss]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    // Years outside 1..=9999 are not dates (and would overflow the day arithmetic below).
    if !(1..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    if !(0..=23).contains(&hh) || !(0..=59).contains(&mm) || !(0..=60).contains(&ss) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86400 + hh * 3600 + mm * 60 + ss)
}

/// Seconds of a Slurm duration: `[DD-]HH:MM:SS`, `MM:SS`, `MM:SS.mmm` or minutes (`Timelimit` may be a
/// plain number of minutes). `None` for `UNLIMITED`, `Partition_Limit`, `INVALID` and the like.
pub fn parse_slurm_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    if s.is_empty() || s.chars().any(|c| c.is_ascii_alphabetic()) {
        return None;
    }
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<f64>().ok()?, r),
        None => (0.0, s),
    };
    let parts: Vec<f64> = rest.split(':').map(|x| x.parse::<f64>().ok()).collect::<Option<_>>()?;
    let secs = match parts[..] {
        [m] if days == 0.0 => m * 60.0,
        [h] => h * 3600.0,
        [m, sec] if days == 0.0 => m * 60.0 + sec,
        [h, m] => h * 3600.0 + m * 60.0,
        [h, m, sec] => h * 3600.0 + m * 60.0 + sec,
        _ => return None,
    };
    (secs >= 0.0).then_some(days * 86400.0 + secs)
}

/// GPUs in an AllocTRES string (`...,gres/gpu=4,gres/gpu:a100=4`): (total, model if named).
fn tres_gpus(tres: &str) -> (u32, Option<String>) {
    let (mut total, mut model) = (0u32, None);
    for item in tres.split(',') {
        let Some((k, v)) = item.split_once('=') else { continue };
        if k == "gres/gpu" {
            total = v.parse().unwrap_or(total);
        } else if let Some(m) = k.strip_prefix("gres/gpu:") {
            model = Some(m.to_string());
            if total == 0 {
                total = v.parse().unwrap_or(0);
            }
        }
    }
    (total, model)
}

fn tres_nodes(tres: &str) -> Option<u32> {
    tres.split(',')
        .find_map(|i| i.strip_prefix("node="))
        .and_then(|v| v.parse().ok())
}

/// Imports a Slurm `sacct --parsable2` dump (see the module doc).
pub fn sacct(file: &str, text: &str, map: &CompatMapping) -> Imported {
    let mut out = Imported::default();
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        out.skip(Problem {
            file: file.into(),
            line: 1,
            field: None,
            reason: "no_header".into(),
            message: "the file is empty; expected a `sacct --parsable2` header line".into(),
        });
        return out;
    };
    let cols: Vec<&str> = header.split('|').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| c.eq_ignore_ascii_case(name));
    let required = ["JobID", "Submit", "Start", "End", "State"];
    let missing: Vec<&str> = required.iter().copied().filter(|c| col(c).is_none()).collect();
    if !missing.is_empty() || (col("NNodes").is_none() && col("AllocTRES").is_none()) {
        out.skip(Problem {
            file: file.into(),
            line: 1,
            field: None,
            reason: "bad_header".into(),
            message: format!(
                "the header lacks {} (needs JobID, Submit, Start, End, State and NNodes or AllocTRES; see the sacct command in docs/traces.md)",
                if missing.is_empty() { "NNodes/AllocTRES".to_string() } else { missing.join(", ") }
            ),
        });
        return out;
    }
    let idx = |name: &str| col(name);
    let (i_id, i_submit, i_start, i_end, i_state) = (
        idx("JobID").expect("checked"),
        idx("Submit").expect("checked"),
        idx("Start").expect("checked"),
        idx("End").expect("checked"),
        idx("State").expect("checked"),
    );
    let (i_user, i_account, i_partition, i_qos) = (idx("User"), idx("Account"), idx("Partition"), idx("QOS"));
    let (i_elapsed, i_limit, i_nnodes, i_tres, i_exit) = (
        idx("Elapsed"),
        idx("Timelimit"),
        idx("NNodes"),
        idx("AllocTRES"),
        idx("ExitCode"),
    );
    let mut subs: Vec<Submit> = Vec::new();
    let mut unmapped_partitions: BTreeMap<String, u64> = BTreeMap::new();
    let mut unknown_qos: BTreeMap<String, u64> = BTreeMap::new();
    let mut unlimited = 0u64;
    for (n, line) in lines {
        let line_no = n as u64 + 1;
        out.lines += 1;
        let f: Vec<&str> = line.split('|').collect();
        let problem = |field: &str, reason: &str, message: String| Problem::at(file, line_no, field, reason, message);
        if f.len() != cols.len() {
            out.skip(problem(
                "line",
                "malformed_line",
                format!("{} fields, the header has {}", f.len(), cols.len()),
            ));
            continue;
        }
        let get = |i: Option<usize>| i.map(|i| f[i].trim()).unwrap_or("");
        let id = f[i_id].trim();
        if id.is_empty() {
            out.skip(problem("JobID", "missing_id", "empty JobID".into()));
            continue;
        }
        if id.contains('.') {
            // A step (`.batch`, `.extern`, `.0`) of a job that has its own line.
            *out.skipped.entry("job_step".into()).or_insert(0) += 1;
            continue;
        }
        if id.contains('[') {
            out.skip(problem(
                "JobID",
                "pending_array",
                format!("`{id}`: array elements that never started"),
            ));
            continue;
        }
        let state = f[i_state].trim();
        let state_word = state.split_whitespace().next().unwrap_or("");
        let Some(submit) = parse_slurm_time(f[i_submit].trim()) else {
            out.skip(problem(
                "Submit",
                "bad_submit",
                format!("`{}` is not a time (YYYY-MM-DDTHH:MM:SS)", f[i_submit].trim()),
            ));
            continue;
        };
        let start = parse_slurm_time(f[i_start].trim());
        let end = parse_slurm_time(f[i_end].trim());
        let Some(start) = start else {
            let reason = if state_word == "CANCELLED" {
                "cancelled_before_start"
            } else {
                "not_started"
            };
            out.skip(problem(
                "Start",
                reason,
                format!("{state}: never started (Start `{}`)", f[i_start].trim()),
            ));
            continue;
        };
        let Some(end) = end else {
            out.skip(problem(
                "End",
                "not_finished",
                format!("{state}: still running (End `{}`)", f[i_end].trim()),
            ));
            continue;
        };
        let elapsed = parse_slurm_duration(get(i_elapsed)).unwrap_or((end - start) as f64);
        if elapsed < 0.0 || end < start {
            out.skip(problem(
                "End",
                "end_before_start",
                format!("End {end} before Start {start}"),
            ));
            continue;
        }
        let nodes = get(i_nnodes)
            .parse::<u32>()
            .ok()
            .or_else(|| tres_nodes(get(i_tres)))
            .filter(|n| *n > 0);
        let Some(nodes) = nodes else {
            out.skip(problem(
                "NNodes",
                "no_nodes",
                format!("NNodes `{}` and AllocTRES name no node count", get(i_nnodes)),
            ));
            continue;
        };
        let walltime = match parse_slurm_duration(get(i_limit)) {
            Some(w) if w > 0.0 => w.max(elapsed),
            _ => {
                unlimited += 1;
                elapsed.max(60.0)
            }
        };
        let exit_code: i64 = get(i_exit).split(':').next().and_then(|c| c.parse().ok()).unwrap_or(0);
        let failed = matches!(
            state_word,
            "FAILED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE"
        );
        let exit = if failed { exit_code.max(1) } else { 0 };
        let mut alloc = Map::new();
        alloc.insert("id".into(), Value::from(id));
        let account = get(i_account);
        if !account.is_empty() {
            alloc.insert("tenant".into(), Value::from(account));
        }
        let user = get(i_user);
        if !user.is_empty() {
            alloc.insert("user".into(), Value::from(user));
        }
        let partition = get(i_partition);
        if !map.partition_mapping.is_empty() && !partition.is_empty() {
            match map.partition_mapping.get(partition) {
                Some(vc) => {
                    alloc.insert("vcluster".into(), Value::from(vc.as_str()));
                }
                None => *unmapped_partitions.entry(partition.to_string()).or_default() += 1,
            }
        }
        let qos = get(i_qos);
        if !qos.is_empty() {
            match map.qos_mapping.get(qos) {
                Some(c) => {
                    alloc.insert("priority".into(), Value::from(*c));
                }
                None => *unknown_qos.entry(qos.to_string()).or_default() += 1,
            }
        }
        alloc.insert("nodes".into(), Value::from(nodes));
        alloc.insert("walltime".into(), Value::from(walltime));
        let (gpus, model) = tres_gpus(get(i_tres));
        if gpus > 0 {
            let mut c = Map::new();
            c.insert("gpu_count".into(), Value::from(gpus.div_ceil(nodes)));
            if let Some(m) = model {
                c.insert("gpu_type".into(), Value::from(m));
            }
            alloc.insert("constraints".into(), Value::Object(c));
        }
        let complete = if exit != 0 {
            Some((id.to_string(), elapsed, exit))
        } else {
            alloc.insert("duration".into(), Value::from(elapsed));
            None
        };
        subs.push((submit, Value::Object(alloc), complete));
    }
    if !unmapped_partitions.is_empty() {
        out.notes.push(format!(
            "partitions without a partition_mapping entry run in vCluster `default`: {}",
            unmapped_partitions
                .iter()
                .map(|(p, n)| format!("{p} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !unknown_qos.is_empty() {
        out.notes.push(format!(
            "QOS without a qos_mapping entry keep the default class: {}",
            unknown_qos
                .iter()
                .map(|(q, n)| format!("{q} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if unlimited > 0 {
        out.notes.push(format!(
            "{unlimited} jobs had no usable Timelimit (UNLIMITED, Partition_Limit): their walltime is their elapsed time"
        ));
    }
    out.allocations = subs.len() as u64;
    out.jsonl = events_to_jsonl(subs);
    out
}

/// Submit events (and completions for failed runs) as JSONL, times relative to the first submission.
fn events_to_jsonl(mut subs: Vec<Submit>) -> String {
    subs.sort_by_key(|s| s.0);
    let t0 = subs.first().map_or(0, |s| s.0);
    let mut lines: Vec<(i64, String)> = Vec::with_capacity(subs.len());
    for (t, alloc, complete) in subs {
        let rel = t - t0;
        lines.push((rel, json!({"ts": rel, "type": "submit", "alloc": alloc}).to_string()));
        if let Some((id, d, exit)) = complete {
            lines.push((
                rel,
                json!({"ts": rel, "type": "complete", "alloc_id": id, "duration": d, "exit": exit}).to_string(),
            ));
        }
    }
    let mut o = String::with_capacity(lines.len() * 160);
    for (_, l) in lines {
        o.push_str(&l);
        o.push('\n');
    }
    o
}

/// Imports the Alibaba GPU-cluster pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
/// pod_phase,creation_time,deletion_time,scheduled_time`). Each scheduled pod becomes a one-node
/// allocation submitted at `creation_time` that runs from scheduling to deletion; its walltime is
/// that run time (the trace has no requests). A pod sharing a GPU (`gpu_milli` < 1000) asks for one
/// whole GPU: Lattice schedules full nodes. QOS → class: LS 7, Guaranteed 6, Burstable 4, BE 1.
pub fn alibaba(file: &str, text: &str) -> Imported {
    let mut out = Imported::default();
    let mut lines = text.lines().enumerate();
    let Some((_, header)) = lines.next() else {
        out.skip(Problem {
            file: file.into(),
            line: 1,
            field: None,
            reason: "no_header".into(),
            message: "empty file".into(),
        });
        return out;
    };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |n: &str| cols.iter().position(|c| *c == n);
    let need = ["name", "num_gpu", "creation_time", "deletion_time", "scheduled_time"];
    if let Some(m) = need.iter().find(|n| col(n).is_none()) {
        out.skip(Problem {
            file: file.into(),
            line: 1,
            field: Some((*m).into()),
            reason: "bad_header".into(),
            message: format!("the header lacks `{m}` (expected the openb pod list columns)"),
        });
        return out;
    }
    let at = |n: &str| col(n).expect("checked");
    let (i_name, i_gpu, i_create, i_delete, i_sched) = (
        at("name"),
        at("num_gpu"),
        at("creation_time"),
        at("deletion_time"),
        at("scheduled_time"),
    );
    let (i_cpu, i_mem, i_spec, i_qos, i_milli) = (
        col("cpu_milli"),
        col("memory_mib"),
        col("gpu_spec"),
        col("qos"),
        col("gpu_milli"),
    );
    let mut subs = Vec::new();
    let mut shared = 0u64;
    for (n, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let line_no = n as u64 + 1;
        out.lines += 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let problem = |field: &str, reason: &str, message: String| Problem::at(file, line_no, field, reason, message);
        if f.len() != cols.len() {
            out.skip(problem(
                "line",
                "malformed_line",
                format!("{} fields, the header has {}", f.len(), cols.len()),
            ));
            continue;
        }
        let num = |i: usize| f[i].parse::<f64>().ok();
        let Some(created) = num(i_create) else {
            out.skip(problem(
                "creation_time",
                "bad_time",
                format!("`{}` is not a number", f[i_create]),
            ));
            continue;
        };
        let sched = num(i_sched).filter(|s| *s > 0.0 || f[i_sched] == "0");
        let Some(sched) = sched.filter(|_| !f[i_sched].is_empty()) else {
            out.skip(problem("scheduled_time", "never_scheduled", "the pod never ran".into()));
            continue;
        };
        let Some(deleted) = num(i_delete) else {
            out.skip(problem(
                "deletion_time",
                "not_finished",
                format!("`{}`: still running", f[i_delete]),
            ));
            continue;
        };
        if deleted < sched || sched < created {
            out.skip(problem(
                "deletion_time",
                "bad_time",
                format!("creation {created}, scheduled {sched}, deletion {deleted} are out of order"),
            ));
            continue;
        }
        let Some(gpus) = f[i_gpu].parse::<u32>().ok() else {
            out.skip(problem(
                "num_gpu",
                "invalid_field",
                format!("`{}` is not a count", f[i_gpu]),
            ));
            continue;
        };
        let run = (deleted - sched).max(1.0);
        let mut alloc = Map::new();
        alloc.insert("id".into(), Value::from(f[i_name]));
        alloc.insert("tenant".into(), Value::from("openb"));
        alloc.insert("nodes".into(), Value::from(1));
        alloc.insert("walltime".into(), Value::from(run));
        alloc.insert("duration".into(), Value::from(run));
        let mut c = Map::new();
        let milli = i_milli.and_then(|i| f[i].parse::<u32>().ok()).unwrap_or(1000);
        let whole = if gpus == 1 && milli > 0 && milli < 1000 {
            shared += 1;
            1
        } else {
            gpus
        };
        if whole > 0 {
            c.insert("gpu_count".into(), Value::from(whole));
            if let Some(spec) = i_spec.map(|i| f[i]).filter(|s| !s.is_empty()) {
                // `A|B` lists acceptable models; a constraint names one, so only single models are kept.
                if !spec.contains('|') {
                    c.insert("gpu_type".into(), Value::from(spec));
                }
            }
        }
        if let Some(cpu) = i_cpu.and_then(|i| f[i].parse::<u64>().ok()).filter(|c| *c > 0) {
            c.insert("cpu_cores".into(), Value::from(cpu.div_ceil(1000)));
        }
        if let Some(mem) = i_mem.and_then(|i| f[i].parse::<u64>().ok()).filter(|m| *m > 0) {
            c.insert("memory_gb".into(), Value::from(mem.div_ceil(1024)));
        }
        if !c.is_empty() {
            alloc.insert("constraints".into(), Value::Object(c));
        }
        let class = match i_qos.map(|i| f[i]) {
            Some("LS") => 7,
            Some("Guaranteed") => 6,
            Some("Burstable") => 4,
            Some("BE") => 1,
            _ => 4,
        };
        alloc.insert("priority".into(), Value::from(class));
        subs.push((created.round() as i64, Value::Object(alloc), None));
    }
    if shared > 0 {
        out.notes.push(format!(
            "{shared} pods shared a GPU (gpu_milli < 1000); each asks for one whole GPU (full-node scheduling)"
        ));
    }
    out.allocations = subs.len() as u64;
    out.jsonl = events_to_jsonl(subs);
    out
}

/// Reads a pod list file and imports it (see [`alibaba`]).
pub fn alibaba_file(path: &Path) -> Result<Imported, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::io(path, e))?;
    Ok(alibaba(&path.display().to_string(), &text))
}

/// Reads a sacct dump and imports it (see [`sacct`]).
pub fn sacct_file(path: &Path, map: &CompatMapping) -> Result<Imported, TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    let text = crate::swf::decode(bytes).map_err(|e| TraceError::io(path, e))?;
    Ok(sacct(&path.display().to_string(), &text, map))
}

/// A workload (e.g. an SWF import) as JSONL: one `submit` (a `claim` for a sensitive claim) per job with
/// every field of its spec ([`crate::export::alloc_json`]), its user and run time; failed jobs get a
/// `complete` event with a non-zero exit instead of a `duration`.
pub fn workload_to_jsonl(w: &Workload) -> String {
    let mut lines = String::with_capacity(w.jobs.len() * 160);
    let name = |r: &lattice_engine::Registry, i: u32| r.names().get(i as usize).cloned().unwrap_or_default();
    for j in &w.jobs {
        let s = &j.spec;
        let (tenant, project, vcluster) = (
            name(&w.tenants, s.tenant.0),
            w.project_name(s).to_string(),
            name(&w.vclusters, s.vcluster.0),
        );
        let names = crate::export::SpecNames {
            tenant: &tenant,
            project: if project.is_empty() { "default" } else { &project },
            vcluster: if vcluster.is_empty() { "default" } else { &vcluster },
            user: j.user(),
            deps: j.deps.iter().map(|&(i, c)| (w.jobs[i].id.clone(), c)).collect(),
        };
        let mut a = crate::export::alloc_json(&j.id, s, &names);
        let ts = j.submit.as_secs_f64();
        if let (Some(r), true) = (j.runtime, j.exit_ok) {
            a.insert("duration".into(), Value::from(r.as_secs_f64()));
        }
        let line = if s.sensitive_claim {
            json!({"ts": ts, "type": "claim", "claim": a})
        } else {
            json!({"ts": ts, "type": "submit", "alloc": a})
        };
        lines.push_str(&line.to_string());
        lines.push('\n');
        if let (Some(r), false) = (j.runtime, j.exit_ok) {
            lines.push_str(
                &json!({"ts": ts, "type": "complete", "alloc_id": j.id, "duration": r.as_secs_f64(), "exit": 1})
                    .to_string(),
            );
            lines.push('\n');
        }
    }
    lines
}

/// A stable keyed pseudonym: `kind-` and 8 hex digits of SHA-256(key, kind, name).
pub fn pseudonym(key: &str, kind: &str, name: &str) -> String {
    let mut h = Sha256::new();
    for part in [key, kind, name] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    format!("{kind}-{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3])
}

/// Counts of names replaced per kind.
pub type Replaced = BTreeMap<&'static str, u64>;

/// Replaces `tenant`, `user`, `project` and `vcluster` in every allocation of a JSONL trace (submits,
/// claims, DAG members) with [`pseudonym`]s; every other byte of a line's meaning is kept. Lines that
/// are not JSON objects are errors naming the line (nothing is dropped silently).
pub fn anonymise_jsonl(file: &str, text: &str, key: &str) -> Result<(String, Replaced), Problem> {
    let mut out = String::with_capacity(text.len());
    let mut replaced = Replaced::new();
    let fields: [(&str, &'static str); 4] = [
        ("tenant", "tenant"),
        ("user", "user"),
        ("project", "project"),
        ("vcluster", "vcluster"),
    ];
    let rewrite = |a: &mut Value, replaced: &mut Replaced| {
        if let Some(obj) = a.as_object_mut() {
            for (field, kind) in fields {
                if let Some(Value::String(s)) = obj.get_mut(field)
                    && !(kind == "vcluster" && s == "default")
                {
                    *s = pseudonym(key, kind, s);
                    *replaced.entry(kind).or_default() += 1;
                }
            }
        }
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            out.push('\n');
            continue;
        }
        let mut v: Value = serde_json::from_str(line).map_err(|e| Problem {
            file: file.into(),
            line: n as u64 + 1,
            field: None,
            reason: "malformed_line".into(),
            message: e.to_string(),
        })?;
        if let Some(obj) = v.as_object_mut() {
            for k in ["alloc", "claim"] {
                if let Some(a) = obj.get_mut(k) {
                    rewrite(a, &mut replaced);
                }
            }
            if let Some(Value::Array(members)) = obj.get_mut("dag").and_then(|d| d.get_mut("allocations")) {
                for a in members {
                    rewrite(a, &mut replaced);
                }
            }
        }
        out.push_str(&v.to_string());
        out.push('\n');
    }
    Ok((out, replaced))
}

/// SWF: user (field 12), group (13), queue (15) and partition (16) ids replaced by stable keyed numbers
/// (1..999,999); comments and every other field are kept. A line with too few fields is an error.
pub fn anonymise_swf(file: &str, text: &str, key: &str) -> Result<(String, Replaced), Problem> {
    let mut out = String::with_capacity(text.len());
    let mut replaced = Replaced::new();
    let number = |kind: &str, v: &str| -> String {
        let p = pseudonym(key, kind, v);
        let hex = &p[p.len() - 8..];
        (u64::from_str_radix(hex, 16).unwrap_or(0) % 999_999 + 1).to_string()
    };
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with(';') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let mut f: Vec<String> = t.split_whitespace().map(str::to_string).collect();
        if f.len() < 16 {
            return Err(Problem {
                file: file.into(),
                line: n as u64 + 1,
                field: None,
                reason: "malformed_line".into(),
                message: format!("{} fields; SWF has 18", f.len()),
            });
        }
        for (i, kind) in [(11, "user"), (12, "group"), (14, "queue"), (15, "partition")] {
            if f[i] != "-1" {
                f[i] = number(kind, &f[i]);
                *replaced.entry(kind).or_default() += 1;
            }
        }
        out.push_str(&f.join(" "));
        out.push('\n');
    }
    Ok((out, replaced))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonl_parse::parse_jsonl;

    #[test]
    fn slurm_times_and_durations() {
        assert_eq!(parse_slurm_time("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_slurm_time("2024-03-01T10:00:05"), Some(1_709_287_205));
        assert_eq!(parse_slurm_time("2000-02-29T00:00:00"), Some(951_782_400));
        for bad in ["Unknown", "None", "2024-13-01T00:00:00", "2024-03-01", ""] {
            assert_eq!(parse_slurm_time(bad), None, "{bad}");
        }
        assert_eq!(parse_slurm_duration("1-02:03:04"), Some(93784.0));
        assert_eq!(parse_slurm_duration("02:03:04"), Some(7384.0));
        assert_eq!(parse_slurm_duration("03:04"), Some(184.0));
        assert_eq!(parse_slurm_duration("30"), Some(1800.0));
        assert_eq!(parse_slurm_duration("2-00"), Some(2.0 * 86400.0));
        // Dates whose day arithmetic would overflow are not dates.
        assert_eq!(parse_slurm_time("9223372036854775807-01-01T00:00:00"), None);
        assert_eq!(parse_slurm_time("10000-01-01T00:00:00"), None);
        assert_eq!(parse_slurm_time("1970-01-02T00:00:00"), Some(86_400));
        assert_eq!(parse_slurm_duration("UNLIMITED"), None);
        assert_eq!(parse_slurm_duration("Partition_Limit"), None);
    }

    #[test]
    fn tres_gpus_and_nodes() {
        assert_eq!(
            tres_gpus("billing=8,cpu=8,gres/gpu=8,gres/gpu:a100=8,mem=64G,node=2"),
            (8, Some("a100".into()))
        );
        assert_eq!(tres_gpus("cpu=4,mem=1G,node=1"), (0, None));
        assert_eq!(tres_nodes("cpu=4,mem=1G,node=3"), Some(3));
    }

    #[test]
    fn pseudonyms_are_stable_and_keyed() {
        assert_eq!(pseudonym("k", "user", "alice"), pseudonym("k", "user", "alice"));
        assert_ne!(pseudonym("k", "user", "alice"), pseudonym("k", "user", "bob"));
        assert_ne!(pseudonym("k", "user", "alice"), pseudonym("other", "user", "alice"));
        assert_ne!(pseudonym("k", "user", "x"), pseudonym("k", "tenant", "x"));
        assert!(pseudonym("k", "tenant", "physics").starts_with("tenant-"));
    }

    #[test]
    fn anonymised_jsonl_replays_the_same() {
        let text = r#"{"ts": 0, "type": "submit", "alloc": {"id": "a", "nodes": 2, "walltime": "1h", "tenant": "physics", "user": "alice", "duration": 600}}
{"ts": 5, "type": "claim", "claim": {"id": "c", "nodes": 1, "tenant": "hospital", "user": "dr-x", "duration": 60}}
{"ts": 9, "type": "submit", "alloc": {"id": "b", "nodes": 1, "walltime": 60, "tenant": "physics", "depends_on": [{"ref": "a"}]}}
"#;
        let (anon, replaced) = anonymise_jsonl("t.jsonl", text, "secret").unwrap();
        assert!(!anon.contains("physics") && !anon.contains("alice") && !anon.contains("dr-x"));
        assert_eq!(replaced.get("tenant"), Some(&3));
        assert_eq!(replaced.get("user"), Some(&2));
        let (a, b) = (parse_jsonl("t", text), parse_jsonl("t", &anon));
        assert_eq!(b.skipped_total(), 0);
        assert_eq!(a.jobs.len(), b.jobs.len());
        assert_eq!(a.tenants.names().len(), b.tenants.names().len());
        for (x, y) in a.jobs.iter().zip(&b.jobs) {
            assert_eq!(
                (x.submit, x.runtime, x.spec.nodes, &x.deps),
                (y.submit, y.runtime, y.spec.nodes, &y.deps)
            );
        }
        let err = anonymise_jsonl("t.jsonl", "{\"ts\": 0,\nnot json\n", "k").unwrap_err();
        assert_eq!((err.line, err.reason.as_str()), (1, "malformed_line"));
    }

    #[test]
    fn anonymised_swf_keeps_every_other_field() {
        let text = "; Version: 2.2\n1 0 5 100 4 -1 -1 4 200 -1 1 17 3 -1 2 1 -1 -1\n2 10 5 100 4 -1 -1 4 200 -1 1 17 3 -1 2 1 -1 -1\n";
        let (anon, replaced) = anonymise_swf("t.swf", text, "k").unwrap();
        let rows: Vec<Vec<&str>> = anon.lines().skip(1).map(|l| l.split(' ').collect()).collect();
        assert_eq!(
            rows[0][11], rows[1][11],
            "stable: the same user maps to the same number"
        );
        assert_ne!(rows[0][11], "17");
        assert_eq!(
            &rows[0][..11],
            &["1", "0", "5", "100", "4", "-1", "-1", "4", "200", "-1", "1"]
        );
        assert!(anon.starts_with("; Version: 2.2\n"));
        assert_eq!(replaced.get("user"), Some(&2));
        assert!(anonymise_swf("t.swf", "1 2 3\n", "k").is_err());
    }
}
