#!/usr/bin/env bash
# The test command (README.md): installs what the tests need, then checks formatting, lints,
# the committed eBPF object, runs every test, and builds and checks the Debian packages. Run
# as root on a fresh Debian 12 machine; as a plain user it skips the installs and uses what is
# already there.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/lib.sh

if [ "$(id -u)" -eq 0 ]; then
    stage "install apt packages, phe" ci/install-deps.sh
    stage "build bpf-linker" ci/build-bpf-linker.sh
else
    echo "note: not root, so no packages are installed; the eBPF tests need root and are skipped"
fi
stage "disk space" ci/disk.sh
stage "rustfmt" cargo fmt --all -- --check
stage "build (tests, all targets)" cargo build --workspace --all-targets --locked
stage "clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
# Without --all-targets no dev-dependency turns on the test-util feature: the agent and the
# aggregation server as the packages build them, without their test equipment.
stage "clippy, product builds (no test-util)" cargo clippy -p penrose-agent -p penrose-aggregator --locked -- -D warnings
if command -v bpf-linker >/dev/null 2>&1; then
    stage "eBPF object is reproducible" ci/check-ebpf.sh
else
    echo "note: bpf-linker is not installed, so the committed eBPF object is not rebuilt"
fi
stage "cargo deny" ci/deny.sh
# The real traces (SOURCES.md) are read from $PENROSE_TRACES (penrose_traces::TraceFolder::
# default_dir). CI clones into a temporary directory, so the folder is looked for beside the
# clone and beside the repository it was cloned from (a local path); say which, loudly if none.
traces=${PENROSE_TRACES:-}
origin=$(git config --get remote.origin.url 2>/dev/null || true)
for dir in ../shared/traces ${origin:+"$origin/../shared/traces"}; do
    if [ -z "$traces" ] && [ -d "$dir" ]; then traces=$dir; fi
done
if [ -n "$traces" ]; then
    PENROSE_TRACES=$(cd "$traces" && pwd)
    export PENROSE_TRACES
    echo "real traces: $PENROSE_TRACES ($(ls "$traces" | grep -c '\.json') files)"
else
    echo "WARNING: no trace folder found; the tests that read real traces will be skipped"
fi
stage "tests" bash -c 'set -o pipefail; cargo test --workspace --locked --no-fail-fast 2>&1 |
    tee "$CARGO_TARGET_DIR/ci-tests.log"'
# A test that cannot run here says "SKIPPED: why" (or is #[ignore]d): count both in the
# summary, so that a skip is never a silent pass.
skipped=$(grep -E '^ *SKIPPED' "$CARGO_TARGET_DIR/ci-tests.log" | sed 's/^ *//' | sort | uniq -c || true)
ignored=$(grep -oE '[0-9]+ ignored' "$CARGO_TARGET_DIR/ci-tests.log" | awk '{s += $1} END {print s + 0}')
if [ -n "$skipped" ]; then
    echo "tests that skipped themselves:"
    echo "$skipped"
fi
STAGE_TIMES+=("$(printf '%-28s %s' "tests skipped / ignored" "$(printf '%s' "$skipped" | grep -c . || true) / $ignored")")
# The .deb packages: built (release), file lists checked, installed into a throwaway root,
# units verified, binaries run from there, purged (docs/operations.md, "Install from packages").
stage "packages" ci/packages.sh
# ci/gpu-check.sh runs only on a lent GPU host; what of it runs without one runs here.
stage "GPU check, offline" bash -c 'bash -n ci/gpu-check.sh &&
    python3 tests/gpu/compare.py --self-test && python3 tests/gpu/torch_workload.py --self-test'
stage "fuzz wire, ciphertexts, tokens, datagrams, key lists, auditor messages, evidence, traces" ci/fuzz.sh 30
summary
