#!/usr/bin/env bash
# Rebuilds the eBPF object from scratch and fails when it differs from the committed one.
# Needs ci/install-deps.sh and ci/build-bpf-linker.sh to have run.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."

export PATH="${PENROSE_TOOLS:-/var/tmp/penrose-tools}/bin:${PATH}"
step "cargo xtask build-ebpf --check"
cargo xtask build-ebpf --check
step_done
