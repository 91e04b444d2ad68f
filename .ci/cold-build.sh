#!/usr/bin/env bash
# Measures the README's first command on a cold machine: `cargo run --release --bin rm-replay` with an
# empty target folder AND an empty cargo registry cache (a fresh CARGO_HOME; crates are downloaded
# again), from a clean copy of the committed tree. Prints the wall time of the build and of the run.
# A benchmark, not a test: it takes minutes and needs the network to the crate registry.
#   .ci/cold-build.sh            # the committed HEAD
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/lattice-cold.XXXXXX)
trap 'rm -rf "$work"' EXIT
git archive HEAD | tar -x -C "$work"
mkdir -p "$work/home"
# The toolchain stays (rustup's); only cargo's registry, git and build caches start empty.
export CARGO_HOME="$work/home" CARGO_TARGET_DIR="$work/target"
unset RUSTC_WRAPPER
cd "$work"
start=$(date +%s.%N)
cargo build --release --locked --bin rm-replay
built=$(date +%s.%N)
cargo run --release --locked --bin rm-replay >/dev/null
ran=$(date +%s.%N)
printf 'cold-build build_s=%.0f first_run_s=%.1f total_s=%.0f\n' \
  "$(echo "$built - $start" | bc)" "$(echo "$ran - $built" | bc)" "$(echo "$ran - $start" | bc)"
