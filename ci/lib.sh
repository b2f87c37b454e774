# Shared helpers for the ci/ scripts: stage banners with elapsed time. Sourced, not run.

ci_stage_start=0

# stage NAME: print a banner and start the stage clock.
stage() {
    ci_stage_start=$(date +%s)
    echo "==> [$(date -u +%H:%M:%S)] $*"
}

# stage_done: print how long the current stage took.
stage_done() {
    echo "<== done in $(( $(date +%s) - ci_stage_start )) s"
}
