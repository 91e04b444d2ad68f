#!/usr/bin/env bash
# Reassembles the committed eBPF object from its source (run after editing lattice.s; needs llvm-mc).
set -euo pipefail
cd "$(dirname "$0")"
"${LLVM_MC:-llvm-mc}" -triple=bpfel -filetype=obj -o lattice.bpf.o lattice.s
