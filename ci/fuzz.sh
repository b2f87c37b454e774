#!/usr/bin/env bash
# Runs the wire-decoder fuzz target for a bounded time (seconds, default 60). cargo-fuzz needs
# unstable compiler flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/lib.sh
seconds=${1:-60}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz into $PENROSE_TOOLS"
    cargo install cargo-fuzz --locked --version ^0.13 --root "$PENROSE_TOOLS"
fi
cd fuzz
# The fuzz build keeps its own target directory: its instrumented objects cannot be shared.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR}-fuzz"
export RUSTC_BOOTSTRAP=1
mkdir -p corpus/wire_decode
cargo fuzz run wire_decode --release -- -max_total_time="$seconds" -rss_limit_mb=1024
