#!/usr/bin/env bash
# The end-to-end command (README.md): installs what the build needs when run as root, builds the
# demo's binaries and the demo driver (xtask) in one release build, so that each crate is
# compiled once and cargo's progress shows, then runs `xtask demo` on those binaries. Extra
# arguments go to the demo (see `cargo xtask demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/lib.sh
if [ "$(id -u)" -eq 0 ]; then
    ci/install-deps.sh
else
    echo "note: not root, so no packages are installed (the build needs libgmp-dev)"
fi
# The release binaries the demo runs, with their test equipment, and xtask beside them: one
# resolution of features, so the libraries xtask links are the ones the binaries use.
build=(cargo build --release --bins
    -p xtask -p penrose-agent -p penrose-aggregator -p penrose-issuer -p penrose-design
    -p penrose-auditor -p penrose-standin
    --features penrose-agent/test-util,penrose-aggregator/test-util)
echo "==> ${build[*]}"
"${build[@]}"
bins="$CARGO_TARGET_DIR/release"
echo "==> xtask demo --bins $bins $*"
exec "$bins/xtask" demo --bins "$bins" "$@"
