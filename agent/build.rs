//! With the `ebpf` feature, provides the eBPF programs' object as `OUT_DIR/lattice.bpf.o`: assembled
//! from `ebpf/lattice.s` with LLVM's assembler (`llvm-mc` from the `llvm` package; `LLVM_MC`
//! overrides the path) when it is installed, else the committed `ebpf/lattice.bpf.o` (the same
//! source assembled by `ebpf/assemble.sh`, so machines without LLVM still build). Without the feature
//! there is nothing to build.
use std::path::PathBuf;
use std::process::Command;

fn llvm_mc() -> Option<String> {
    if let Ok(p) = std::env::var("LLVM_MC") {
        return Some(p);
    }
    let mut names = vec!["llvm-mc".to_string()];
    names.extend((11..=22).rev().map(|v| format!("llvm-mc-{v}")));
    names.into_iter().find(|n| {
        Command::new(n)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn main() {
    println!("cargo:rerun-if-changed=ebpf/lattice.s");
    println!("cargo:rerun-if-changed=ebpf/lattice.bpf.o");
    println!("cargo:rerun-if-env-changed=LLVM_MC");
    if std::env::var_os("CARGO_FEATURE_EBPF").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("lattice.bpf.o");
    match llvm_mc() {
        Some(mc) => {
            let status = Command::new(&mc)
                .args(["-triple=bpfel", "-filetype=obj", "-o"])
                .arg(&out)
                .arg("ebpf/lattice.s")
                .status()
                .unwrap_or_else(|e| panic!("running {mc}: {e}"));
            assert!(status.success(), "{mc} failed to assemble ebpf/lattice.s");
        }
        None => {
            println!("cargo:warning=llvm-mc not found: using the committed ebpf/lattice.bpf.o");
            std::fs::copy("ebpf/lattice.bpf.o", &out).expect("copying ebpf/lattice.bpf.o");
        }
    }
}
