#!/usr/bin/env bash
# Checks dependencies against deny.toml: licences, bans (duplicates) and sources. Advisories
# need the RustSec database from the network; they run only when PENROSE_DENY_ADVISORIES=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/lib.sh
if ! command -v cargo-deny >/dev/null 2>&1; then
    echo "installing cargo-deny into $PENROSE_TOOLS"
    cargo install cargo-deny --locked --version ^0.19 --root "$PENROSE_TOOLS"
fi
checks=(bans licenses sources)
if [ "${PENROSE_DENY_ADVISORIES:-0}" = 1 ]; then
    checks+=(advisories)
fi
cargo deny --all-features check "${checks[@]}"
