//! Fuzzing every parser of outside input that `rm-replay` and the `lattice` client read — SWF, JSONL
//! events, sacct and Alibaba imports, weight profiles, inventories, tenant contracts, `#SBATCH` /
//! `#LATTICE` directives — on stable Rust: structure-aware mutation of the bundled traces and configs
//! (line and token level, with boundary values), seeded with `rand_chacha` so a case is reproduced by
//! its seed and number. A parser may refuse any input, but must never panic, and every problem it
//! reports names its file and line. `rm-replay fuzz --target NAME --cases N` runs them; the tests run a
//! small budget of each.

use lattice_traces::fuzz::{below, mutate};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

/// The fuzz targets, by name.
pub const TARGETS: [&str; 8] = [
    "swf",
    "jsonl",
    "sacct",
    "alibaba",
    "profile",
    "inventory",
    "tenants",
    "directives",
];

const ALIBABA_SEED: &str =
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061
openb-pod-0002,8000,30720,0,0,,BE,Succeeded,600000,900000,610000
openb-pod-0003,2000,4096,2,1000,V100M32,LS,Failed,700000,800000,
";

const DIRECTIVES_SEED: &str = "#!/bin/bash
#SBATCH --nodes=4
#SBATCH -t 01:30:00
#SBATCH --partition=gpu
#SBATCH --account=ml-team
#SBATCH --job-name=train
#SBATCH --gres=gpu:a100:4
#SBATCH --qos=high
#SBATCH --array=0-99%20
#SBATCH --mem=64G
#LATTICE --walltime=2h
#LATTICE --constraint=nvme_scratch
srun ./train
";

/// The seed inputs of a target (bundled traces and configs).
fn seeds(target: &str) -> Vec<&'static str> {
    match target {
        "swf" => vec![crate::DEMO_TRACE],
        "jsonl" => vec![
            include_str!("../../traces/library/preemption-heavy.jsonl"),
            include_str!("../../traces/library/sensitive-claim.jsonl"),
            include_str!("../../traces/library/steady-state.jsonl"),
        ],
        "sacct" => vec![include_str!("../../traces/tests/fixtures/sacct-awkward.txt")],
        "alibaba" => vec![ALIBABA_SEED],
        "profile" => vec![
            include_str!("../../profiles/balanced.yaml"),
            include_str!("../../profiles/ml-training.yaml"),
            include_str!("../../traces/library/sensitive-claim.profile.yaml"),
        ],
        "inventory" => vec![
            include_str!("../../traces/library/library-128.yaml"),
            include_str!("../../traces/library/library-sensitive-128.yaml"),
            include_str!("../../profiles/inventory/example.yaml"),
        ],
        "tenants" => vec![include_str!("../../traces/library/tenants.yaml")],
        "directives" => vec![DIRECTIVES_SEED],
        _ => Vec::new(),
    }
}

/// What one input did: `Ok(true)` accepted whole, `Ok(false)` refused (in part) with problems naming
/// where, `Err` a finding.
fn check(target: &str, input: &str) -> Result<bool, String> {
    let named = |problems: &[lattice_traces::Problem]| -> Result<bool, String> {
        match problems.iter().find(|p| p.file.is_empty() || p.line == 0) {
            Some(p) => Err(format!("a problem without file or line: {p}")),
            None => Ok(problems.is_empty()),
        }
    };
    let config_error = |e: lattice_traces::TraceError| -> Result<bool, String> {
        let m = e.to_string();
        if m.contains("fuzz.") {
            Ok(false)
        } else {
            Err(format!("an error that does not name the file: {m}"))
        }
    };
    match target {
        "swf" => {
            let w =
                lattice_traces::swf::parse_swf_with("fuzz.swf", input, &lattice_traces::SwfOptions::default(), true);
            named(&w.problems)
        }
        "jsonl" => named(&lattice_traces::parse_jsonl("fuzz.jsonl", input).problems),
        "sacct" => named(
            &lattice_traces::import::sacct("fuzz.txt", input, &lattice_traces::import::CompatMapping::default())
                .problems,
        ),
        "alibaba" => named(&lattice_traces::import::alibaba("fuzz.csv", input).problems),
        "profile" => lattice_traces::parse_profile("fuzz.yaml", input)
            .map(|_| true)
            .or_else(config_error),
        "inventory" => lattice_traces::parse_inventory("fuzz.yaml", input)
            .map(|_| true)
            .or_else(config_error),
        "tenants" => lattice_traces::parse_tenants("fuzz.yaml", input)
            .map(|_| true)
            .or_else(config_error),
        "directives" => Ok(crate::directives::parse_script(input).1.is_empty()),
        other => Err(format!("unknown target {other}")),
    }
}

/// A finding: the case that caused it (reproduced by `--seed` and the case number) and what went wrong.
#[derive(Clone, Debug)]
pub struct Finding {
    pub case: u64,
    pub what: String,
    pub input: String,
}

/// What a fuzz run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub cases: u64,
    /// Inputs refused in whole or in part (the rest were accepted whole).
    pub refused: u64,
    pub panics: u64,
    pub findings: Vec<Finding>,
}

/// Runs `cases` mutated inputs through `target` (case `i` uses the generator seeded with `seed + i`).
pub fn run(target: &str, cases: u64, seed: u64) -> Result<Report, String> {
    let inputs = seeds(target);
    if inputs.is_empty() {
        return Err(format!(
            "unknown fuzz target `{target}` (known: {})",
            TARGETS.join(", ")
        ));
    }
    let mut report = Report::default();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for i in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(i));
        let base = inputs[below(&mut rng, inputs.len())];
        let input = mutate(base, &mut rng);
        report.cases += 1;
        match std::panic::catch_unwind(|| check(target, &input)) {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => report.refused += 1,
            Ok(Err(what)) => report.findings.push(Finding { case: i, what, input }),
            Err(p) => {
                report.panics += 1;
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                report.findings.push(Finding {
                    case: i,
                    what: format!("panic: {what}"),
                    input,
                });
            }
        }
    }
    std::panic::set_hook(hook);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_and_change_the_input() {
        let text = crate::DEMO_TRACE;
        let a = mutate(text, &mut ChaCha8Rng::seed_from_u64(7));
        let b = mutate(text, &mut ChaCha8Rng::seed_from_u64(7));
        assert_eq!(a, b);
        let changed = (0..20)
            .filter(|s| mutate(DIRECTIVES_SEED, &mut ChaCha8Rng::seed_from_u64(*s)) != DIRECTIVES_SEED.trim_end())
            .count();
        assert!(changed >= 15, "{changed}");
    }

    /// A short budget of every target: no panic, every problem names its file and line.
    #[test]
    fn every_parser_survives_a_short_budget() {
        for t in TARGETS {
            let r = run(t, 300, 20261124).unwrap();
            assert_eq!(r.cases, 300);
            assert!(r.findings.is_empty(), "{t}: {:?}", r.findings.first());
        }
        assert!(run("nope", 1, 0).is_err());
    }
}
