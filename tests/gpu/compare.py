"""Compares what the agent captured from the real libcuda with torch.profiler's kernel list.

Usage: compare.py CAPTURE_JSON PROFILER_JSON
CAPTURE_JSON is `penrose-agent capture --json --all-names` output; PROFILER_JSON is what
torch_workload.py wrote. Prints a JSON verdict: launch counts for the workload's pid, and how
many of the profiler's kernel names the agent saw (after demangling the driver's mangled
names with c++filt when it is there; the profiler shows demangled names).
"""

import collections
import json
import shutil
import subprocess
import sys


def demangle(names):
    if not shutil.which("c++filt") or not names:
        return list(names)
    out = subprocess.run(
        ["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return out if len(out) == len(names) else list(names)


def main():
    capture = json.load(open(sys.argv[1]))
    profiler = json.load(open(sys.argv[2]))
    pid = profiler["pid"]
    ours = [s for s in capture["snippets"] if s["pid"] == pid]
    agent_names = []
    for snippet in ours:
        agent_names.extend(snippet.get("all_names", []))
    agent_launches = sum(s["launches"] for s in ours)
    demangled = demangle(agent_names)
    prof = collections.Counter(profiler["kernels"])
    seen = collections.Counter(demangled)
    common = sum((prof & seen).values())
    verdict = {
        "device": profiler.get("device"),
        "torch": profiler.get("torch"),
        "cuda": profiler.get("cuda"),
        "workload_pid": pid,
        "profiler_kernels": len(profiler["kernels"]),
        "profiler_distinct": len(prof),
        "agent_launches_for_pid": agent_launches,
        "agent_distinct_names": len(seen),
        # Launches without a name: an identity (`<bid:...>`) or a name-free token's label
        # (`<token:...>`); older agents labelled them all `<unnamed>`.
        "agent_unnamed": sum(s.get("unnamed", 0) for s in ours) or seen.get("<unnamed>", 0),
        "agent_identified": sum(s.get("identified", 0) for s in ours),
        "agent_tokens": sum(s.get("tokens", 0) for s in ours),
        "launches_matched_by_name": common,
        "profiler_names_never_seen": sorted(set(prof) - set(seen))[:20],
        "agent_names_not_in_profiler": sorted(set(seen) - set(prof))[:20],
        "drops": capture.get("drops"),
        "counts": capture.get("counts"),
        "libraries": capture.get("libraries"),
    }
    print(json.dumps(verdict, indent=1))


if __name__ == "__main__":
    main()
