//! `lattice-cli` — the command-line tools. `rm-replay` replays a workload trace through the very engine
//! the production runtime runs, on a virtual clock ([`replay`]), prints the seed's "RM-Replay Results"
//! block ([`report`]) — against a baseline profile with arrows ([`compare`]) —, writes the output contract
//! (`summary.json`, `jobs.csv`), sweeps weights ([`sweep`]), runs the regression suite ([`regress`]) and
//! measures itself ([`bench`]). The `lattice` client (`bin/lattice.rs`) talks to `lattice-runtime`'s REST API;
//! [`directives`] reads its scripts' `#LATTICE`/`#SBATCH` lines; [`launch`] runs `lattice launch` and
//! its `srun` form; [`terminal`] is `lattice attach`'s and `lattice session`'s terminal; [`login`] is `lattice login`'s OIDC
//! device flow and token cache; [`observe`] renders `top ID`, `compare`, `diag`, `history` and `dag graph`.

pub mod bench;
pub mod client;
pub mod compare;
pub mod directives;
pub mod fuzz;
pub mod launch;
pub mod login;
pub mod observe;
pub mod reference;
pub mod regress;
pub mod replay;
pub mod report;
pub mod status;
pub mod sweep;
pub mod terminal;

/// The bundled demo trace (`traces/library/demo-128n.swf`), replayed when no `--trace` is given.
pub const DEMO_TRACE: &str = include_str!("../../traces/library/demo-128n.swf");
pub const DEMO_TRACE_NAME: &str = "traces/library/demo-128n.swf";
