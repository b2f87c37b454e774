#!/usr/bin/env bash
# The capture check on a real GPU (capture issue, "On a GPU"): the agent attaches to the real
# libcuda, a short PyTorch workload runs under torch.profiler, and tests/gpu/compare.py sets
# the launches and kernel names the agent saw against the profiler's list. Run as root on a
# GPU host, from the repository root, with a release build of penrose-agent in
# $PENROSE_AGENT (default .gpu/penrose-agent). Results go to $OUT (default /tmp/gpu-check).
set -u
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
agent=${PENROSE_AGENT:-.gpu/penrose-agent}
seconds=${PENROSE_GPU_CHECK_SECONDS:-40}
{
    uname -r
    nvidia-smi -L 2>&1 | head -2
    ldconfig -p | grep 'libcuda.so.1 '
} >"$out/host.txt" 2>&1

"$agent" capture --seconds "$seconds" --window-launches 1000000 --json --all-names \
    >"$out/capture.json" 2>"$out/agent.log" &
agent_pid=$!
# The workload must start after the probes are attached: wait for the agent's start line.
for _ in $(seq 1 150); do
    grep -q "capture:" "$out/agent.log" 2>/dev/null && break
    kill -0 "$agent_pid" 2>/dev/null || break
    sleep 0.2
done
sleep 1
python3 tests/gpu/torch_workload.py "$out/profiler.json" 20 >"$out/workload.log" 2>&1
echo "workload exit $?" >>"$out/workload.log"
wait "$agent_pid"
echo "agent exit $?" >>"$out/agent.log"
python3 tests/gpu/compare.py "$out/capture.json" "$out/profiler.json" | tee "$out/verdict.json"
