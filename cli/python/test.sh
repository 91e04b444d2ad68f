#!/usr/bin/env bash
# The Python SDK's tests against a real lattice-runtime: a virtualenv with the SDK installed from this
# directory (`pip install ./cli/python[test]`, as a user would), the runtime and agent built by cargo,
# pytest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
venv=${LATTICE_SDK_VENV:-$target/python-sdk-venv}
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian's python3 needs python3-venv for `python3 -m venv`.
    rm -rf "$venv"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv) >/dev/null
    fi
    python3 -m venv "$venv"
  fi
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$here[test]"
# The README's test command builds the workspace's tests with these features (its binaries land in
# target/debug): the same build, so after it this is a no-op rather than a build with other features.
features=${LATTICE_TEST_FEATURES:-lattice-agent/nvidia,lattice-agent/ebpf,lattice-runtime/federation}
(cd "$root" && cargo test -q --workspace --locked --no-run --features "$features")
cd "$here"
LATTICE_RUNTIME_BIN="$target/debug/lattice-runtime" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
