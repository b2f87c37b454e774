# Shared helpers for the CI scripts: stage timing and the cached build locations.
# Sourced, not run.

# Reuse one target directory between runs on the same machine (docs/design.md section 8); a cold
# run simply fills it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/penrose-target}"
# Tools CI builds itself (bpf-linker, cargo-fuzz, cargo-deny) live here, outside the clone.
export PENROSE_TOOLS="${PENROSE_TOOLS:-/var/tmp/penrose-tools}"
export PATH="$PENROSE_TOOLS/bin:$PATH"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

PENROSE_CI_START=${PENROSE_CI_START:-$(date +%s)}
export PENROSE_CI_START
STAGE_TIMES=()

# stage NAME COMMAND...: runs one stage, prints its duration, records it for the summary, and
# stops the script with the stage's exit code if it fails.
stage() {
    local name=$1
    shift
    local t0
    t0=$(date +%s)
    echo
    echo "==> [$name] $*"
    "$@"
    local rc=$?
    local dt=$(($(date +%s) - t0))
    STAGE_TIMES+=("$(printf '%-28s %5ds  %s' "$name" "$dt" "$([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")")")
    echo "<== [$name] ${dt}s"
    if [ $rc -ne 0 ]; then
        summary
        exit $rc
    fi
}

summary() {
    echo
    echo "== stage times =="
    printf '%s\n' "${STAGE_TIMES[@]}"
    echo "total: $(($(date +%s) - PENROSE_CI_START))s"
}

# step NAME / step_done: a banner and its duration, for steps inside one stage's script.
ci_step_start=0
step() {
    ci_step_start=$(date +%s)
    echo "--> [$(date -u +%H:%M:%S)] $*"
}
step_done() {
    echo "<-- done in $(($(date +%s) - ci_step_start)) s"
}
