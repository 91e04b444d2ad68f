//! `lattice launch` and its `srun` compatibility form: a task launch within a running allocation
//! (`POST /v1/allocations/{id}/tasks`), waited for, with each rank's stdout and stderr printed apart
//! (book: "MPI Process Management", "Slurm Compatibility").

use serde_json::{Value, json};
use std::collections::BTreeMap;

/// What to launch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchArgs {
    pub ntasks: Option<u32>,
    pub tasks_per_node: Option<u32>,
    pub env: BTreeMap<String, String>,
    pub pmi: Option<String>,
    pub fence_timeout: Option<String>,
    /// `RANK: ` before each line of output.
    pub label: bool,
    pub command: Vec<String>,
}

impl LaunchArgs {
    /// The request body.
    pub fn body(&self) -> Value {
        let mut b = json!({"entrypoint": crate::directives::shell_join(&self.command)});
        if let Some(n) = self.ntasks {
            b["ntasks"] = json!(n);
        }
        if let Some(k) = self.tasks_per_node {
            b["tasks_per_node"] = json!(k);
        }
        if !self.env.is_empty() {
            b["env"] = json!(self.env);
        }
        if let Some(p) = &self.pmi {
            b["pmi"] = json!(p);
        }
        if let Some(t) = &self.fence_timeout {
            b["fence_timeout"] = json!(t);
        }
        b
    }
}

/// `K=V` pairs (`--env`, `--export`).
pub fn parse_env(pairs: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("--env {p}: expected NAME=VALUE"))?;
        env.insert(k.to_string(), v.to_string());
    }
    Ok(env)
}

/// `srun`'s flags as a launch: `-n`/`--ntasks`, `--ntasks-per-node`, `--export=K=V,...`,
/// `-l`/`--label`, `--mpi`; `-N`/`--nodes` and naming flags are accepted and ignored (a launch spans
/// the allocation's nodes). The first word that is not a flag starts the command.
pub fn from_srun(args: &[String]) -> Result<LaunchArgs, String> {
    let mut out = LaunchArgs::default();
    let mut i = 0;
    let num = |flag: &str, v: Option<&str>| -> Result<u32, String> {
        v.and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("srun {flag}: expected a number"))
    };
    while i < args.len() {
        let a = args[i].as_str();
        if !a.starts_with('-') {
            break;
        }
        if a == "--" {
            i += 1;
            break;
        }
        // `--flag=value`, `--flag value`, `-n4`, `-n 4`.
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ if !a.starts_with("--") && a.len() > 2 => (&a[..2], Some(a[2..].to_string())),
            _ => (a, None),
        };
        let takes_value = matches!(
            flag,
            "-n" | "--ntasks"
                | "--ntasks-per-node"
                | "--export"
                | "--mpi"
                | "-N"
                | "--nodes"
                | "-J"
                | "--job-name"
                | "-c"
                | "--cpus-per-task"
                | "-t"
                | "--time"
                | "-o"
                | "--output"
                | "-e"
                | "--error"
        );
        let value = if takes_value && inline.is_none() {
            i += 1;
            args.get(i).cloned()
        } else {
            inline
        };
        match flag {
            "-n" | "--ntasks" => out.ntasks = Some(num(flag, value.as_deref())?),
            "--ntasks-per-node" => out.tasks_per_node = Some(num(flag, value.as_deref())?),
            "--export" => {
                let v = value.unwrap_or_default();
                // ALL / NONE select what to inherit, which a launch always does.
                let pairs: Vec<String> = v.split(',').filter(|p| p.contains('=')).map(String::from).collect();
                out.env.extend(parse_env(&pairs)?);
            }
            "--mpi" => out.pmi = value,
            "-l" | "--label" => out.label = true,
            "-N" | "--nodes" | "-J" | "--job-name" | "-c" | "--cpus-per-task" | "-t" | "--time" | "-o" | "--output"
            | "-e" | "--error" => {}
            other => return Err(format!("srun {other}: not supported by Lattice's srun")),
        }
        i += 1;
    }
    out.command = args[i..].to_vec();
    if out.command.is_empty() {
        return Err("srun: nothing to run".into());
    }
    Ok(out)
}

/// How a launch ended, for the caller's exit status: 0 when every rank exited 0, else the first
/// failing rank's code (1 when none failed but the launch did, e.g. it was aborted).
pub fn exit_status(view: &Value) -> i32 {
    if view["state"] == "completed" {
        return 0;
    }
    view["exit_codes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p[1].as_i64())
        .find(|c| *c != 0)
        .map_or(1, |c| c.clamp(1, 255) as i32)
}

/// Each rank's output in rank order: (stdout, stderr) text, labelled when asked.
pub fn rank_output(view: &Value, label: bool) -> (String, String) {
    let mut out = String::new();
    let mut err = String::new();
    for r in view["output"].as_array().into_iter().flatten() {
        let rank = r["rank"].as_u64().unwrap_or(0);
        for (text, to) in [(r["stdout"].as_str(), &mut out), (r["stderr"].as_str(), &mut err)] {
            let text = text.unwrap_or_default();
            if label {
                for line in text.lines() {
                    to.push_str(&format!("{rank}: {line}\n"));
                }
            } else {
                to.push_str(text);
            }
        }
    }
    (out, err)
}

/// `ALLOC.N` → (`ALLOC`, N) when `id` names a task launch.
pub fn launch_of(id: &str) -> Option<(&str, u32)> {
    let (alloc, n) = id.rsplit_once('.')?;
    let n = n.parse().ok()?;
    (!alloc.is_empty() && !alloc.contains('/')).then_some((alloc, n))
}

/// The last `n` lines of `text` (all of it without `n`).
pub fn last_lines(text: &str, n: Option<usize>) -> String {
    let Some(n) = n else { return text.to_string() };
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    lines[lines.len().saturating_sub(n)..].concat()
}

/// A launch's ranks' stdout (or stderr): each rank's under a `==> rank R <==` header, in rank order,
/// the last `tail` lines of each.
pub fn rank_logs(view: &Value, stderr: bool, rank: Option<u32>, tail: Option<usize>) -> String {
    let key = if stderr { "stderr" } else { "stdout" };
    let ranks: Vec<&Value> = view["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| rank.is_none_or(|x| r["rank"].as_u64() == Some(x as u64)))
        .collect();
    let mut out = String::new();
    for r in &ranks {
        if ranks.len() > 1 {
            out.push_str(&format!("==> rank {} <==\n", r["rank"].as_u64().unwrap_or(0)));
        }
        out.push_str(&last_lines(r[key].as_str().unwrap_or_default(), tail));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn srun_flags_become_a_launch() {
        let l = from_srun(&v(&[
            "-n4",
            "--ntasks-per-node=2",
            "--export=ALL,A=1,B=x=y",
            "-l",
            "./app",
            "-n",
            "9",
        ]))
        .unwrap();
        assert_eq!((l.ntasks, l.tasks_per_node, l.label), (Some(4), Some(2), true));
        assert_eq!(l.env["A"], "1");
        assert_eq!(l.env["B"], "x=y");
        // The program's own flags are its own.
        assert_eq!(l.command, v(&["./app", "-n", "9"]));
        let l = from_srun(&v(&["-n", "8", "-N", "2", "--mpi=pmi2", "hostname"])).unwrap();
        assert_eq!((l.ntasks, l.pmi.as_deref()), (Some(8), Some("pmi2")));
        assert!(from_srun(&v(&["-n", "x", "a"])).is_err());
        assert!(from_srun(&v(&["--pty", "bash"])).unwrap_err().contains("--pty"));
        assert!(from_srun(&v(&["-n", "2"])).is_err());
        let body = from_srun(&v(&["-n", "2", "echo", "a b"])).unwrap().body();
        assert_eq!(body["entrypoint"], "echo 'a b'");
        assert_eq!(body["ntasks"], 2);
    }

    #[test]
    fn the_exit_status_is_the_first_failing_ranks() {
        assert_eq!(exit_status(&json!({"state": "completed", "exit_codes": [[0, 0]]})), 0);
        assert_eq!(
            exit_status(&json!({"state": "failed", "exit_codes": [[0, 0], [1, 3], [2, 9]]})),
            3
        );
        assert_eq!(exit_status(&json!({"state": "failed", "exit_codes": [[0, 0]]})), 1);
        assert_eq!(exit_status(&json!({"state": "failed", "exit_codes": [[0, 300]]})), 255);
    }

    #[test]
    fn output_is_printed_in_rank_order_and_labelled_on_request() {
        let view = json!({"output": [
            {"rank": 0, "stdout": "a\nb\n", "stderr": ""},
            {"rank": 1, "stdout": "c\n", "stderr": "oops\n"}]});
        assert_eq!(rank_output(&view, false), ("a\nb\nc\n".into(), "oops\n".into()));
        assert_eq!(
            rank_output(&view, true),
            ("0: a\n0: b\n1: c\n".into(), "1: oops\n".into())
        );
        assert!(parse_env(&v(&["NOEQUALS"])).is_err());
    }

    #[test]
    fn logs_of_a_launch_keep_each_ranks_streams_apart() {
        assert_eq!(launch_of("a-000012.3"), Some(("a-000012", 3)));
        assert_eq!(launch_of("a-000012"), None);
        assert_eq!(launch_of("a-000012[4]"), None);
        let view = json!({"output": [
            {"rank": 0, "stdout": "a\nb\nc\n", "stderr": "e0\n"},
            {"rank": 1, "stdout": "d\n", "stderr": "e1\nf1\n"}]});
        assert_eq!(
            rank_logs(&view, false, None, Some(2)),
            "==> rank 0 <==\nb\nc\n==> rank 1 <==\nd\n"
        );
        assert_eq!(rank_logs(&view, true, Some(1), Some(1)), "f1\n");
        assert_eq!(last_lines("x\ny", Some(1)), "y");
        assert_eq!(last_lines("x\ny\n", None), "x\ny\n");
    }
}
