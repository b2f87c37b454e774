#!/usr/bin/env bash
# The capture check on a real GPU (issue 9 item 7). Run as root on a GPU host with the NVIDIA
# driver and PyTorch with CUDA installed (no network needed), from anywhere, with a release
# build of penrose-agent in $PENROSE_AGENT (default .gpu/penrose-agent, relative to the
# current directory). Results go to $OUT (default /tmp/gpu-check).
#
# Four cases, each a PyTorch workload (tests/gpu/torch_workload.py: linear layers and batched
# matmuls through cuBLAS/cuBLASLt, layer norm, softmax, GELU, dropout, cross entropy, forward
# and backward, AdamW) under torch.profiler, and `penrose-agent capture --json --all-names
# --launches` attached to the real driver and runtime:
#   attached  the agent starts first (given the runtime and driver files the workload maps,
#             as an operator's configuration would), then the workload runs;
#   late      the workload starts first, registers its kernels and runs warm-up iterations,
#             then the agent starts (finding the libraries through the running process and
#             naming what was registered before it from the process's symbols and memory),
#             then the workload runs its later iterations.
#   graph     the agent first, then the block's forward pass captured once in a CUDA graph
#             (torch.cuda.graphs) and replayed: the agent must expand each graph launch into
#             the kernels the profiler records under it (issue 24);
#   counters  the agent first with the product's counter source (--counters nvml, one launch
#             in 50 sampled), then the workload: launches must be sampled, every sampled launch
#             attributed to a GPU (single_device counts on a one-GPU host), none lost to a
#             device error or an unsupported group, and some must get values (compare.py
#             --counters; GPM's minimum interval refuses samples closer than it: too_soon);
#   devices   only where `nvidia-smi -L` lists two GPUs or more (else skipped: "one GPU on this
#             host"): the agent first, with NVML counters (--counters nvml, so that sampled
#             launches are attributed to GPUs), then two workloads at once, one with
#             CUDA_VISIBLE_DEVICES=0 and one with CUDA_VISIBLE_DEVICES=1 (issue 24 item 8).
#             Each workload's launches are matched against its own profiler output
#             (devices-0, devices-1), and the capture must attribute every sampled launch to a
#             GPU (counts.devices: none unattributed; by_uuid + by_visible_devices +
#             single_visible = counts.sampled > 0). The case holds when all three do.
# tests/gpu/compare.py aligns the agent's launches of the workload's pid with the profiler's,
# launch by launch, and writes a verdict per case (target: >= 99% of launches with a name
# equal to the profiler's, or an identity that stands for exactly one profiler kernel).
#
# $OUT gets eight files (a lent host returns at most eight): verdict.json (every case in
# short), verdict-attached.json, verdict-late.json, verdict-graph.json, verdict-counters.json
# and verdict-devices.json (each in full; the devices one holds its workloads' verdicts and
# the attribution), gpu-check.log (this script's steps) and run.tar.gz with everything else:
# host.txt, agent-*.log, capture-*.json, workload-*.log, profiler-*.json, verdict-devices-N.json,
# trace-*.json.gz (the profiler's own traces, left out if the bundle would pass 15 MiB) and
# torch-probe.json. Intermediate files live in a temporary folder ($PENROSE_GPU_CHECK_WORK to
# keep them somewhere else).
# Exit code: 0 every case holds the target (a skipped case counts for nothing), 1 one does
# not, 2 a run failed (not root, no agent, no PyTorch or no GPU, a process crashed or hung);
# verdict.json says which.
set -u
final=${OUT:-/tmp/gpu-check}
mkdir -p "$final"
out=${PENROSE_GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check-work.XXXXXX)}
mkdir -p "$out"
agent=${PENROSE_AGENT:-.gpu/penrose-agent}
python=${PYTHON:-python3}
iterations=${PENROSE_GPU_CHECK_ITERATIONS:-30}
# The devices case samples one launch in this many (the agent's default, 1,000, would sample
# only a few of the workloads' launches, and the attribution check needs some).
sample_period=${PENROSE_GPU_CHECK_SAMPLE_PERIOD:-100}
# The agent's own limit; it is stopped as soon as its workload has ended.
agent_seconds=${PENROSE_GPU_CHECK_SECONDS:-280}
# Every wait below ends by this deadline, so a hung step cannot hold the host.
deadline=$(($(date +%s) + ${PENROSE_GPU_CHECK_DEADLINE_S:-360}))
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tests/gpu" && pwd)
started=$(date +%s)

say() { echo "gpu-check: $*" | tee -a "$out/gpu-check.log" >&2; }
left() { echo $((deadline - $(date +%s))); }
# The smaller of $1 seconds and what is left before the deadline (at least 1).
budget() {
    local l
    l=$(left)
    if ((l < $1)); then echo $((l > 1 ? l : 1)); else echo "$1"; fi
}

# write_verdict STATUS CASE REASON: the verdict of a case that did not run to a comparison,
# STATUS "skipped" (this host cannot run it) or "run_failed".
write_verdict() {
    local flag=--failed
    [ "$1" = skipped ] && flag=--skipped
    say "$2: ${1/_/ }: $3"
    if command -v "$python" >/dev/null 2>&1; then
        "$python" "$here/compare.py" "$flag" "$3" --case "$2" >"$out/verdict-$2.json"
    else
        printf '{"case": "%s", "status": "%s", "reason": "%s"}\n' "$2" "$1" "$3" \
            >"$out/verdict-$2.json"
    fi
}

# write_failed CASE REASON: a failed run's verdict for CASE.
write_failed() { write_verdict run_failed "$1" "$2"; }

# write_skipped CASE REASON: the verdict of a case this host cannot run.
write_skipped() { write_verdict skipped "$1" "$2"; }

finish() {
    local rc
    if command -v "$python" >/dev/null 2>&1; then
        "$python" "$here/compare.py" --combine "$out/verdict-attached.json" \
            "$out/verdict-late.json" "$out/verdict-graph.json" "$out/verdict-counters.json" \
            "$out/verdict-devices.json" >"$out/verdict.json"
        rc=$?
    else
        printf '{"status": "run_failed", "reason": "no %s"}\n' "$python" >"$out/verdict.json"
        rc=2
    fi
    say "done in $(($(date +%s) - started)) s, exit $rc"
    pack
    cat "$final/verdict.json"
    exit "$rc"
}

# The few files $OUT gets; everything else in one bundle.
pack() {
    local f
    for f in verdict.json verdict-attached.json verdict-late.json verdict-graph.json \
        verdict-counters.json verdict-devices.json gpu-check.log; do
        [ -e "$out/$f" ] && cp "$out/$f" "$final/$f"
    done
    tar -czf "$final/run.tar.gz" -C "$out" --exclude=late.ready --exclude=late.go .
    if [ "$(stat -c %s "$final/run.tar.gz")" -gt $((15 << 20)) ]; then
        tar -czf "$final/run.tar.gz" -C "$out" --exclude=late.ready --exclude=late.go \
            --exclude='trace-*' .
    fi
    [ -n "${PENROSE_GPU_CHECK_WORK:-}" ] || rm -rf "$out"
}

# Every case fails for a reason found before any ran.
fail_all() {
    write_failed attached "$1"
    write_failed late "$1"
    write_failed graph "$1"
    write_failed counters "$1"
    write_failed devices "$1"
    finish
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "kernel: $(uname -r)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
    echo "nvidia-smi -L:"
    nvidia-smi -L 2>&1 | head -16
    echo "libcuda (ldconfig):"
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libcudart\.so' | head -6
    echo "python: $("$python" --version 2>&1)"
    echo "c++filt: $(command -v c++filt || echo absent)"
    echo "agent: $agent ($("$agent" --version 2>&1 | head -1))"
    echo "checkout: $(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)"
} >"$out/host.txt" 2>&1

[ "$(id -u)" = 0 ] || fail_all "not root: the agent's eBPF probes need root"
[ -x "$agent" ] || fail_all "no agent binary at $agent (set PENROSE_AGENT)"
command -v "$python" >/dev/null 2>&1 || fail_all "no $python"

# PyTorch, the GPU, and the runtime and driver files a PyTorch process maps.
timeout "$(budget 120)" "$python" "$here/torch_workload.py" --probe \
    >"$out/torch-probe.json" 2>"$out/torch-probe.log"
probe_rc=$?
cat "$out/torch-probe.json" >>"$out/host.txt"
if [ "$probe_rc" != 0 ]; then
    reason=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("error") or "")' \
        "$out/torch-probe.json" 2>/dev/null)
    fail_all "PyTorch with CUDA is not usable here (probe exit $probe_rc): ${reason:-see torch-probe.log}"
fi
mapfile -t libs < <("$python" -c '
import json, sys
info = json.load(open(sys.argv[1]))
for path in info.get("cudart", []) + info.get("libcuda", []):
    print(path)' "$out/torch-probe.json")
lib_args=()
for l in "${libs[@]}"; do lib_args+=(--lib "$l"); done
say "PyTorch maps: ${libs[*]:-no runtime or driver file}"

agent_pid=
# The exit status of an agent that ended before its window opened (empty: it did not end).
agent_rc=
# start_agent CASE [--counters KIND] [ARGS...]: starts the capture and waits until its first
# window is open (launch probes attached). Fails if the agent exits or the window does not
# open in time.
start_agent() {
    local case=$1 counters=none log
    shift
    if [ "${1:-}" = --counters ]; then
        counters=$2
        shift 2
    fi
    log="$out/agent-$case.log"
    agent_rc=
    # The capture module's debug lines say when a window opens. Counters are not compared
    # by default (none): NVML/GPM stops the agent where GPM is missing (a VM, pre-Hopper);
    # the devices case asks for nvml, which sampled launches need to be attributed to GPUs.
    RUST_LOG=info,penrose_agent::capture=debug "$agent" capture \
        --seconds "$agent_seconds" --window-launches 1000000 --json --all-names --launches \
        --counters "$counters" "$@" >"$out/capture-$case.json" 2>"$log" &
    agent_pid=$!
    local until=$(($(date +%s) + $(budget 90)))
    while (($(date +%s) < until)); do
        grep -q "window opened" "$log" 2>/dev/null && return 0
        if ! kill -0 "$agent_pid" 2>/dev/null; then
            wait "$agent_pid"
            agent_rc=$?
            echo "agent exit $agent_rc" >>"$log"
            return 1
        fi
        sleep 0.2
    done
    stop_agent "$case"
    return 1
}

# stop_agent CASE: SIGINT (the agent prints what it saw and exits), SIGKILL if it hangs.
stop_agent() {
    local log="$out/agent-$1.log" _
    kill -INT "$agent_pid" 2>/dev/null
    for _ in $(seq 1 150); do
        kill -0 "$agent_pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -0 "$agent_pid" 2>/dev/null && kill -KILL "$agent_pid" 2>/dev/null
    wait "$agent_pid"
    echo "agent exit $?" >>"$log"
}

# wait_pid PID SECONDS: waits for a background process; kills it if it runs longer. Returns
# its exit status (124 when killed).
wait_pid() {
    local until=$(($(date +%s) + $2))
    while kill -0 "$1" 2>/dev/null; do
        if (($(date +%s) >= until)); then
            kill -KILL "$1" 2>/dev/null
            wait "$1"
            return 124
        fi
        sleep 0.2
    done
    wait "$1"
}

# compare_case CASE [RUN]: the verdict of CASE from its profiler output and the capture and
# agent log of RUN (default CASE; the devices case's two workloads share one capture).
compare_case() {
    local run=${2:-$1}
    "$python" "$here/compare.py" "$out/capture-$run.json" "$out/profiler-$1.json" --case "$1" \
        --agent-log "$out/agent-$run.log" >"$out/verdict-$1.json"
    say "$1: compare exit $?"
}

# --- attached: the agent first -----------------------------------------------------------------
say "attached: starting the agent (${lib_args[*]:-no --lib})"
if start_agent attached "${lib_args[@]}"; then
    sleep 0.5
    timeout "$(budget 150)" "$python" "$here/torch_workload.py" "$out/profiler-attached.json" \
        --iterations "$iterations" --trace "$out/trace-attached.json.gz" \
        >"$out/workload-attached.log" 2>&1
    workload_rc=$?
    echo "workload exit $workload_rc" >>"$out/workload-attached.log"
    # The process's exit record reaches the agent within its poll interval.
    sleep 1
    stop_agent attached
    if [ "$workload_rc" = 0 ]; then
        compare_case attached
    else
        write_failed attached "the workload exited $workload_rc (workload-attached.log)"
    fi
else
    write_failed attached "the agent did not open its window (agent-attached.log)"
fi

# --- late: the workload first ------------------------------------------------------------------
ready="$out/late.ready"
go="$out/late.go"
rm -f "$ready" "$go"
say "late: starting the workload"
"$python" "$here/torch_workload.py" "$out/profiler-late.json" --late "$ready" "$go" \
    --iterations "$iterations" --wait-s "$(budget 200)" --trace "$out/trace-late.json.gz" \
    >"$out/workload-late.log" 2>&1 &
workload_pid=$!
until=$(($(date +%s) + $(budget 150)))
while [ ! -e "$ready" ] && kill -0 "$workload_pid" 2>/dev/null && (($(date +%s) < until)); do
    sleep 0.2
done
if [ ! -e "$ready" ]; then
    kill -KILL "$workload_pid" 2>/dev/null
    wait "$workload_pid"
    write_failed late "the workload did not get ready (exit $?; workload-late.log)"
elif start_agent late; then
    say "late: agent attached to a running workload (pid $(cat "$ready"))"
    touch "$go"
    wait_pid "$workload_pid" "$(budget 150)"
    workload_rc=$?
    echo "workload exit $workload_rc" >>"$out/workload-late.log"
    sleep 1
    stop_agent late
    if [ "$workload_rc" = 0 ]; then
        compare_case late
    else
        write_failed late "the workload exited $workload_rc (workload-late.log)"
    fi
else
    touch "$go"
    wait_pid "$workload_pid" "$(budget 60)"
    write_failed late "the agent did not open its window (agent-late.log)"
fi
rm -f "$ready" "$go"

# --- graph: the agent first, then CUDA graph replays ----------------------------------------------
say "graph: starting the agent"
if start_agent graph "${lib_args[@]}"; then
    sleep 0.5
    timeout "$(budget 150)" "$python" "$here/torch_workload.py" "$out/profiler-graph.json" \
        --graph --iterations "$iterations" --trace "$out/trace-graph.json.gz" \
        >"$out/workload-graph.log" 2>&1
    workload_rc=$?
    echo "workload exit $workload_rc" >>"$out/workload-graph.log"
    sleep 1
    stop_agent graph
    if [ "$workload_rc" = 0 ]; then
        compare_case graph
    else
        write_failed graph "the workload exited $workload_rc (workload-graph.log)"
    fi
else
    write_failed graph "the agent did not open its window (agent-graph.log)"
fi

# --- counters: the agent first with the product's counter source --------------------------------
say "counters: starting the agent with NVML counters"
if start_agent counters --counters nvml --sample-period 50 "${lib_args[@]}"; then
    sleep 0.5
    timeout "$(budget 150)" "$python" "$here/torch_workload.py" "$out/profiler-counters.json" \
        --iterations 20 >"$out/workload-counters.log" 2>&1
    workload_rc=$?
    echo "workload exit $workload_rc" >>"$out/workload-counters.log"
    sleep 1
    stop_agent counters
    if [ "$workload_rc" = 0 ]; then
        "$python" "$here/compare.py" "$out/capture-counters.json" --counters \
            >"$out/verdict-counters.json"
        say "counters: compare exit $?"
    else
        write_failed counters "the workload exited $workload_rc (workload-counters.log)"
    fi
elif [ "$agent_rc" = 3 ]; then
    write_failed counters "the agent could not open NVML/GPM (agent-counters.log)"
else
    write_failed counters "the agent did not open its window (agent-counters.log)"
fi

# --- devices: two workloads at once, one per GPU, the agent first with NVML counters -----------
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if ((gpus == 1)); then
    write_skipped devices "one GPU on this host"
elif ((gpus < 2)); then
    write_skipped devices "nvidia-smi -L lists no GPU"
else
    say "devices: $gpus GPUs; starting the agent with NVML counters (${lib_args[*]:-no --lib})"
    if start_agent devices --counters nvml --sample-period "$sample_period" "${lib_args[@]}"; then
        sleep 0.5
        device_pids=()
        for d in 0 1; do
            CUDA_VISIBLE_DEVICES=$d "$python" "$here/torch_workload.py" \
                "$out/profiler-devices-$d.json" --iterations "$iterations" \
                --trace "$out/trace-devices-$d.json.gz" >"$out/workload-devices-$d.log" 2>&1 &
            device_pids+=($!)
        done
        # Both run at once: one limit for the two.
        until=$(($(date +%s) + $(budget 150)))
        device_rcs=()
        for d in 0 1; do
            wait_pid "${device_pids[$d]}" $((until - $(date +%s)))
            device_rcs+=($?)
            echo "workload exit ${device_rcs[$d]}" >>"$out/workload-devices-$d.log"
        done
        sleep 1
        stop_agent devices
        for d in 0 1; do
            if [ "${device_rcs[$d]}" = 0 ]; then
                compare_case "devices-$d" devices
            else
                write_failed "devices-$d" \
                    "the workload exited ${device_rcs[$d]} (workload-devices-$d.log)"
            fi
        done
        # The case: both workloads' verdicts and the capture's attribution of sampled launches.
        "$python" "$here/compare.py" "$out/capture-devices.json" --devices \
            "$out/verdict-devices-0.json" "$out/verdict-devices-1.json" \
            >"$out/verdict-devices.json"
        say "devices: exit $?"
    elif [ "$agent_rc" = 3 ] && grep -qiE 'error.*(nvml|gpm)' "$out/agent-devices.log"; then
        # Exit 3 is a missing prerequisite; said of NVML or GPM, it is the counter source.
        write_failed devices "the agent could not open NVML/GPM (agent-devices.log)"
    elif [ -n "$agent_rc" ]; then
        write_failed devices \
            "the agent exited $agent_rc before its window opened (agent-devices.log)"
    else
        write_failed devices "the agent did not open its window (agent-devices.log)"
    fi
fi

finish
