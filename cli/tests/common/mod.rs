//! Helpers shared by the `rm-replay` end-to-end tests: run the binary from the repository root (as CI
//! does), a fresh scratch folder per test, and the process's whole output.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

pub fn rm_replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rm-replay"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("rm-replay runs")
}

pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lattice-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
