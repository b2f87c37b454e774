#!/usr/bin/env bash
# Makes room before the build. The cached target directories (lib.sh) are only a cache: when
# the disk they live on has less than PENROSE_MIN_FREE_GIB (default 12) free, they are
# removed and the build starts cold. A run that ran out of disk once died in the linker
# (SIGBUS while writing a test binary), far from the cause; this says it up front.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

min_gib=${PENROSE_MIN_FREE_GIB:-12}
free_gib() {
    local dir=$1
    while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
    df -Pk "$dir" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'
}

step "free disk"
df -h "$(dirname "$CARGO_TARGET_DIR")" /tmp 2>/dev/null || true
for dir in "$CARGO_TARGET_DIR" "$CARGO_TARGET_DIR-fuzz"; do
    [ -d "$dir" ] && du -sh "$dir" 2>/dev/null || true
done
have=$(free_gib "$CARGO_TARGET_DIR")
if [ "$have" -lt "$min_gib" ]; then
    echo "only ${have} GiB free (< ${min_gib} GiB): removing the cached target directories"
    rm -rf "$CARGO_TARGET_DIR" "$CARGO_TARGET_DIR-fuzz"
    have=$(free_gib "$CARGO_TARGET_DIR")
fi
if [ "$have" -lt 4 ]; then
    echo "WARNING: ${have} GiB free for the build; a cold build and the tests need about 4 GiB," \
        "so the linker or RocksDB may fail for lack of space"
fi
step_done
