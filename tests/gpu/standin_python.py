#!/usr/bin/env python3
"""Test equipment: runs ci/gpu-check.sh on a machine without a GPU or PyTorch.

Given as $PYTHON to ci/gpu-check.sh, it stands in for the Python that has PyTorch. Calls of
tests/gpu/torch_workload.py replay a one-process profiler trace through the stand-in driver and
runtime (penrose-replay, penrose-standin) instead of training on a GPU, and write the JSON the
real workload writes, its launches built from the trace by the workload's own
launches_in_order; every other call goes to this interpreter. It checks the script's flow
(agent start, window detection, late attach through a running process, stop, verdicts), the
agent's launch log and compare.py on real captures; it says nothing about real CUDA stacks.

    PENROSE_STANDIN_REPLAY  penrose-replay
    PENROSE_STANDIN_LIBS    a folder with libcuda.so.1, libcudart.so.13,
                            libpenrose_nvcc_app.so and libpenrose_static.so (penrose-standin's
                            build output)
    PENROSE_STANDIN_TRACE   a trace whose kernels are all one process's
    PENROSE_STANDIN_VIA     runtime (default: nvcc-style stubs, named) or static (the stripped
                            library: identities)

As root, from the repository root:
    PYTHON=tests/gpu/standin_python.py PENROSE_AGENT=... PENROSE_STANDIN_...=... \
        OUT=/tmp/standin-check ci/gpu-check.sh

The late case has no idle gap to cut at (the replayer cannot pause), so its scope is the
whole run and its share matched stays below the target; its aligned launches are what to read.
"""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def libs():
    d = os.environ["PENROSE_STANDIN_LIBS"]
    return {
        "lib": os.path.join(d, "libcuda.so.1"),
        "cudart": os.path.join(d, "libcudart.so.13"),
        "app": os.path.join(d, "libpenrose_nvcc_app.so"),
        "static-lib": os.path.join(d, "libpenrose_static.so"),
    }


def via():
    return os.environ.get("PENROSE_STANDIN_VIA", "runtime")


def replay_command(extra):
    cmd = [os.environ["PENROSE_STANDIN_REPLAY"], "--json", "--via", via()]
    if via() == "runtime":
        # Stubs registered under their own symbols' names, as nvcc's are (the agent names
        # late-attached processes from those symbols).
        cmd.append("--self-named")
    for flag, path in libs().items():
        cmd += [f"--{flag}", path]
    return cmd + extra + [os.environ["PENROSE_STANDIN_TRACE"]]


def trace_rows():
    sys.path.insert(0, HERE)
    import torch_workload

    path = os.environ["PENROSE_STANDIN_TRACE"]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = torch_workload.launches_in_order(json.load(f))
    for r in rows:
        # The replayer launches unknown or zero dimensions as 1, as a driver needs.
        for key in ("grid", "block"):
            r[key] = [max(1, int(v)) for v in (r.get(key) or [1, 1, 1])]
    return rows


def write(out, summary, rows, mode):
    replayed = summary["replayed"]
    launches = [dict(rows[i % len(rows)]) for i in range(replayed)]
    # What a profiler shows for a self-named stub's kernel: its registered name, demangled
    # (_Z13penrose_k0007Pv is penrose_k0007(void*)).
    renamed = {
        f["name"]: re.sub(r"^_Z\d+(penrose_k\d+)Pv$", r"\1(void*)", f["registered_name"])
        for f in summary.get("functions", [])
        if f.get("registered_name")
    }
    for r in launches:
        r["name"] = renamed.get(r["name"], r["name"])
    doc = {
        "pid": summary["pid"],
        "mode": mode,
        "torch": "stand-in",
        "cuda": None,
        "device": f"stand-in driver, via {via()}",
        "launches": launches,
        "kernels": [r["name"] for r in launches],
        "without_launch_call": 0,
        "gpu_order_differs_at": None,
        "after_attach": None,
        "attach_gap_s": None,
    }
    with open(out, "w") as f:
        json.dump(doc, f)
    print(f"stand-in workload pid {summary['pid']}: {replayed} launches ({mode})")


def workload(args):
    if "--probe" in args:
        paths = libs()
        print(json.dumps({
            "torch": "stand-in",
            "cuda": None,
            "cuda_available": True,
            "device": "stand-in driver",
            "cudart": [paths["cudart"]] if via() == "runtime" else [],
            "libcuda": [paths["lib"]],
        }))
        return 0
    out = args[0]
    rows = trace_rows()
    if "--late" not in args:
        done = subprocess.run(replay_command(["--loop", "2"]), capture_output=True, text=True)
        sys.stderr.write(done.stderr)
        if done.returncode != 0:
            return done.returncode
        write(out, json.loads(done.stdout), rows, "attached")
        return 0
    ready, go = args[args.index("--late") + 1: args.index("--late") + 3]
    span_s = max(1e-3, (rows[-1]["launch_ts_us"] - rows[0]["launch_ts_us"]) / 1e6)
    # About two loops a second, whatever the trace's own length.
    child = subprocess.Popen(
        replay_command(["--loop-forever", "--pace", "trace", "--speed", str(span_s * 2)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)
    with open(ready, "w") as f:
        f.write(f"{child.pid}\n")
    deadline = time.monotonic() + 180
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)
    child.send_signal(signal.SIGINT)
    stdout, _ = child.communicate(timeout=60)
    if child.returncode != 0:
        return child.returncode
    write(out, json.loads(stdout), rows, "late")
    return 0


def main():
    args = sys.argv[1:]
    if args and os.path.basename(args[0]) == "torch_workload.py":
        return workload(args[1:])
    os.execv(sys.executable, [sys.executable] + args)


if __name__ == "__main__":
    sys.exit(main())
