#!/usr/bin/env bash
# Runs each fuzz target for a bounded time (seconds per target, default 30): the wire decoder,
# the ciphertext checks with the accumulator behind them, the anonymous token decoders, the
# stream port's datagram decoder (the Tor path), the design key list decoder and the release
# auditor's protocol and contributor evidence decoders, which face the network, and the trace reader. cargo-fuzz needs unstable compiler flags;
# RUSTC_BOOTSTRAP lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/lib.sh
seconds=${1:-30}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz into $PENROSE_TOOLS"
    cargo install cargo-fuzz --locked --version ^0.13 --root "$PENROSE_TOOLS"
fi
cd fuzz
# The fuzz build keeps its own target directory: its instrumented objects cannot be shared.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR}-fuzz"
export RUSTC_BOOTSTRAP=1
for target in wire_decode ciphertexts token_decode datagram_frames key_list audit_decode evidence_decode trace_parse; do
    step "fuzz $target for ${seconds}s"
    mkdir -p "corpus/$target"
    cargo fuzz run "$target" --release -- -max_total_time="$seconds" -rss_limit_mb=2048
    step_done
done
