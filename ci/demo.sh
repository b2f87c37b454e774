#!/usr/bin/env bash
# The end-to-end command (README.md): installs what the build needs when run as root, then runs
# `cargo xtask demo`. Extra arguments go to the demo (see `cargo xtask demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/lib.sh
if [ "$(id -u)" -eq 0 ]; then
    ci/install-deps.sh
else
    echo "note: not root, so no packages are installed (the build needs libgmp-dev)"
fi
echo "==> cargo xtask demo $*"
exec cargo xtask demo "$@"
