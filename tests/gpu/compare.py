"""Sets the agent's launches against torch.profiler's, launch by launch (ci/gpu-check.sh).

Usage:
    compare.py CAPTURE_JSON PROFILER_JSON [--case CASE] [--agent-log LOG]
    compare.py CAPTURE_JSON --devices VERDICT_JSON...
    compare.py --combine VERDICT_JSON...
    compare.py --failed REASON [--case CASE]
    compare.py --skipped REASON [--case CASE]
    compare.py --self-test

CASE is attached (the default), late, graph, devices or devices-N (one workload of the devices
case); a verdict names late "late_attach" and every other case as given. Only late aligns
differently (below); graph and devices-N, like attached, had the agent started first.

CAPTURE_JSON is `penrose-agent capture --json --all-names --launches` output; PROFILER_JSON is
what torch_workload.py wrote. The agent's sequence for the workload's pid (its launch log, in
the order it read the launches; without one, the snippets' names) is aligned with the
profiler's launches in launch order: position by position when both have the same length and
the launch configurations agree, else by a longest common subsequence of (grid, block) tokens
(which do not depend on the names being judged; difflib when the two are too far apart). In the late case only the profiler's launches after the agent
attached count (the workload's "after_attach"; without it the agent's sequence is aligned with
the end of the whole run).

A profiler launch is matched when the aligned agent launch
- is named and its name, demangled (c++filt, else the C++ runtime's __cxa_demangle), equals
  the profiler's name ("named_equal"), or
- carries an identity (`<bid:BUILDID+0xOFF gX.. bX.. sN>`, `<file:...>`) that stands for
  exactly one profiler name over the whole run, and the profiler kernel it stands for (name,
  grid, block, shared memory) got that one identity every time: a bijection between identities
  and kernels ("identified_consistently"). An identity includes the launch configuration, so
  one kernel launched with two configurations has two identities; that is not a violation.
Otherwise it is "unnamed" (`<unnamed>`, `<graph>`), "mismatched" (a different name, or an
identity that breaks the bijection) or "missing" (no agent launch aligned with it).

The devices case (two workloads at once, one per GPU, under one agent) has a verdict per
workload (devices-0, devices-1: the comparison above, each against its own profiler output; the
workload's pid picks its launches out of the one capture) and `--devices` joins them with the
capture's device attribution: every sampled launch (counts.sampled > 0) attributed to a GPU
through a UUID the driver gave, the process's visible devices, or the one device its start
environment makes visible (by_uuid + by_visible_devices + single_visible = sampled), and
none unattributed (counts.devices.unattributed all 0). The case holds when every workload and
the attribution hold.

`--combine` puts case verdicts together (verdict.json); a "skipped" case (the devices case on a
host with one GPU) neither fails nor holds anything up.

Prints the verdict as JSON. Exit code: 0 when the share matched is at least the target
(99%), or the case was skipped, 1 when it is not (or the attribution does not hold), 2 when
the run itself failed (inputs missing or unreadable, no profiled launches, no sampled launch).
"""

import argparse
import collections
import ctypes
import ctypes.util
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TARGET = 0.99
OK, BELOW_TARGET, RUN_FAILED = 0, 1, 2
UNNAMED = "<unnamed>"
GRAPH = "<graph>"
IDENTITY = re.compile(r"^<(?:bid|file):\S+ g(\d+)x(\d+)x(\d+) b(\d+)x(\d+)x(\d+) s(\d+)>$")
MISSES_SHOWN = 20
# Insertions plus deletions up to which the exact alignment is computed (its time grows with
# their number times the length).
MAX_EDITS = 1000


class RunFailed(Exception):
    """The inputs say the run did not happen as it should (exit 2)."""


# ---------------------------------------------------------------------------------------------
# Demangling


class Demangler:
    """Demangled forms of agent names: c++filt's, cu++filt's (the CUDA toolkit's, which also
    knows nvcc's extended lambdas, `Unvhdl...`, as the profiler's CUPTI names do) and the C++
    runtime's, when there."""

    def __init__(self, use_cxxfilt=True, use_cxa=True):
        self.cxxfilt = shutil.which("c++filt") if use_cxxfilt else None
        self.cuxxfilt = _cuxxfilt() if use_cxxfilt else None
        self.cxa = _cxa_demangle_function() if use_cxa else None

    def available(self):
        return [
            n
            for n, f in (
                ("c++filt", self.cxxfilt),
                ("cu++filt", self.cuxxfilt),
                ("__cxa_demangle", self.cxa),
            )
            if f
        ]

    def forms(self, names):
        """name -> set of forms (the name itself and its demangled forms)."""
        names = sorted(set(names))
        out = {n: {n} for n in names}
        mangled = [n for n in names if n.startswith("_Z")]
        for tool in (self.cxxfilt, self.cuxxfilt):
            if tool and mangled:
                _filter_forms(tool, mangled, out)
        if self.cxa:
            for n in mangled:
                d = self.cxa(n)
                if d:
                    out[n].add(d)
        return out


def _cuxxfilt():
    """The CUDA toolkit's cu++filt: on the PATH, else under /usr/local/cuda/bin."""
    return shutil.which("cu++filt") or shutil.which("cu++filt", path="/usr/local/cuda/bin")


def _filter_forms(tool, mangled, out):
    """Adds each mangled name's form as the filter program `tool` prints it."""
    try:
        lines = subprocess.run(
            [tool],
            input="\n".join(mangled) + "\n",
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return
    if len(lines) == len(mangled):
        for n, d in zip(mangled, lines):
            out[n].add(d.strip())


def _cxa_demangle_function():
    """abi::__cxa_demangle through ctypes (what kineto demangles with), or None."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        f = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_void_p
    f.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    libc.free.argtypes = [ctypes.c_void_p]

    def demangle(name):
        status = ctypes.c_int(-1)
        p = f(name.encode(), None, None, ctypes.byref(status))
        if not p:
            return None
        try:
            return ctypes.string_at(p).decode(errors="replace") if status.value == 0 else None
        finally:
            libc.free(p)

    return demangle


# ---------------------------------------------------------------------------------------------
# Inputs


def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise RunFailed(f"{what} {path}: {e}") from e


def dims(value):
    if isinstance(value, (list, tuple)) and len(value) == 3:
        try:
            return tuple(int(v) for v in value)
        except (TypeError, ValueError):
            return None
    return None


def identity_config(name):
    """(grid, block, smem) of an identity string, or None for anything else."""
    m = IDENTITY.match(name)
    if not m:
        return None
    v = [int(x) for x in m.groups()]
    return (tuple(v[0:3]), tuple(v[3:6]), v[6])


def agent_launches(capture, pid):
    """The agent's launches of `pid` in reading order: [{"name", "grid", "block", "smem"}]."""
    log = capture.get("launch_log")
    if isinstance(log, list):
        out = [
            {
                "name": str(l.get("name")),
                "grid": dims(l.get("grid")),
                "block": dims(l.get("block")),
                "smem": l.get("smem"),
            }
            for l in log
            if l.get("pid") == pid
        ]
        return out, "launch_log"
    out = []
    snippets = sorted(
        (s for s in capture.get("snippets", []) if s.get("pid") == pid),
        key=lambda s: s.get("window", 0),
    )
    for s in snippets:
        names = s.get("all_names")
        if names is None:
            raise RunFailed("the capture has neither a launch log nor all_names")
        for n in names:
            config = identity_config(n)
            out.append(
                {
                    "name": n,
                    "grid": config[0] if config else None,
                    "block": config[1] if config else None,
                    "smem": config[2] if config else None,
                }
            )
    return out, "snippets.all_names"


def profiler_launches(profiler, late):
    """The profiler's launches that count, in launch order, and where they start."""
    rows = profiler.get("launches")
    if rows is None:
        # An older workload: names only.
        rows = [{"name": n} for n in profiler.get("kernels", [])]
    rows = [
        {
            "name": str(r.get("name")),
            "grid": dims(r.get("grid")),
            "block": dims(r.get("block")),
            "smem": r.get("shared_memory"),
        }
        for r in rows
    ]
    start, scope = 0, "all launches"
    if late:
        after = profiler.get("after_attach")
        if isinstance(after, int) and 0 <= after <= len(rows):
            start, scope = after, "after the agent attached"
        else:
            scope = "all launches (the workload did not mark where the agent attached)"
    return rows, start, scope


# ---------------------------------------------------------------------------------------------
# Alignment


def config_token(launch):
    if launch["grid"] is None or launch["block"] is None:
        return None
    return (launch["grid"], launch["block"])


def align(agent, prof, prefer_suffix=False):
    """Pairs (agent index, profiler index), and how they were found.

    Same lengths: position by position, when the configurations agree (or there are none).
    With `prefer_suffix` (an agent that attached late) a shorter agent sequence is first tried
    against the end of the profiler's. Otherwise difflib.
    """
    have_configs = all(config_token(a) for a in agent) and all(config_token(p) for p in prof)
    offset = None
    if len(agent) == len(prof):
        offset = 0
    elif prefer_suffix and have_configs and len(agent) < len(prof):
        offset = len(prof) - len(agent)
    if offset is not None:
        pairs = list(zip(range(len(agent)), range(offset, len(prof))))
        if not have_configs:
            return pairs, "positional"
        agree = sum(config_token(agent[i]) == config_token(prof[j]) for i, j in pairs)
        if not agent or agree >= TARGET * len(agent):
            return pairs, "positional" if offset == 0 else "positional, at the end"
    if have_configs:
        a_tokens = [config_token(a) for a in agent]
        p_tokens = [config_token(p) for p in prof]
        on = "(grid, block)"
    else:
        a_tokens = [a["name"] for a in agent]
        p_tokens = [p["name"] for p in prof]
        on = "names (the capture has no launch configurations)"
    common = lcs_pairs(a_tokens, p_tokens, MAX_EDITS)
    if common is not None:
        how = f"longest common subsequence on {on}"
    else:
        # Too far apart for the exact alignment: difflib's blocks (greedy, and easily misled
        # by a workload's repeated iterations).
        matcher = difflib.SequenceMatcher(None, a_tokens, p_tokens, autojunk=False)
        common = [
            (a0 + n, p0 + n) for a0, p0, size in matcher.get_matching_blocks() for n in range(size)
        ]
        how = f"difflib on {on} (more than {MAX_EDITS} edits apart)"
    return fill_equal_gaps(common, len(agent), len(prof)), how


def lcs_pairs(a, b, max_edits):
    """The index pairs of a longest common subsequence of `a` and `b` (Myers' O(ND) diff), or
    None when more than `max_edits` insertions and deletions separate them."""
    n, m = len(a), len(b)
    v = {1: 0}
    # Per round d, what it read: the furthest x on the diagonals -d+1, -d+3, ..., d-1.
    trace = []
    for d in range(max_edits + 1):
        trace.append([v[k] for k in range(1 - d, d, 2)])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[k - 1] < v[k + 1]):
                x = v[k + 1]
            else:
                x = v[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            v[k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m)
    return None


def _backtrack(trace, x, y):
    pairs = []
    for d in range(len(trace) - 1, -1, -1):
        if d == 0:
            prev_x = prev_y = 0
        else:
            row = trace[d]
            at = lambda k: row[(k + d - 1) // 2]  # noqa: E731
            k = x - y
            prev_k = k + 1 if k == -d or (k != d and at(k - 1) < at(k + 1)) else k - 1
            prev_x = at(prev_k)
            prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x, y = x - 1, y - 1
            pairs.append((x, y))
        x, y = prev_x, prev_y
    pairs.reverse()
    return pairs


def fill_equal_gaps(pairs, n, m):
    """`pairs` plus the launches between two aligned ones when both sides have the same
    number there (the same launches, with a configuration or name that differs)."""
    out = []
    last = (-1, -1)
    for nxt in list(pairs) + [(n, m)]:
        gap_a, gap_p = nxt[0] - last[0] - 1, nxt[1] - last[1] - 1
        if gap_a == gap_p and gap_a > 0:
            out.extend((last[0] + 1 + t, last[1] + 1 + t) for t in range(gap_a))
        if nxt != (n, m):
            out.append(nxt)
        last = nxt
    return out


# ---------------------------------------------------------------------------------------------
# The verdict


def is_identity(name):
    return name.startswith(("<bid:", "<file:"))


def case_label(case):
    """The name a verdict gives a case (`--case late` is "late_attach")."""
    return "late_attach" if case == "late" else case


def case_arg(value):
    """`--case`: attached, late, graph, counters, devices or devices-N."""
    if value in ("attached", "late", "graph", "counters", "devices") or re.fullmatch(
        r"devices-\d+", value
    ):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r}: not attached, late, graph, counters, devices or devices-N"
    )


def compare(capture, profiler, case, demangler):
    late = case == "late"
    pid = profiler.get("pid")
    if pid is None:
        raise RunFailed("the profiler output names no pid")
    prof_all, start, scope = profiler_launches(profiler, late)
    prof = prof_all[start:]
    if not prof:
        raise RunFailed("the profiler recorded no kernel launch in scope")
    agent, agent_source = agent_launches(capture, pid)
    pairs, how = align(agent, prof, prefer_suffix=late)
    forms = demangler.forms(a["name"] for a in agent)

    # Identities: which profiler names and kernels each stands for, over the whole run.
    by_identity = collections.defaultdict(collections.Counter)
    by_kernel = collections.defaultdict(collections.Counter)
    for i, j in pairs:
        name = agent[i]["name"]
        if is_identity(name):
            p = prof[j]
            by_identity[name][p["name"]] += 1
            by_kernel[(p["name"], p["grid"], p["block"], p["smem"])][name] += 1
    bad_identities = {n for n, c in by_identity.items() if len(c) > 1}
    bad_kernels = {k for k, c in by_kernel.items() if len(c) > 1}

    outcome = ["missing"] * len(prof)
    agent_of = [None] * len(prof)
    config_checked = config_agrees = 0
    for i, j in pairs:
        a, p = agent[i], prof[j]
        agent_of[j] = a["name"]
        if config_token(a) and config_token(p):
            config_checked += 1
            config_agrees += config_token(a) == config_token(p)
        name = a["name"]
        if name in (UNNAMED, GRAPH):
            outcome[j] = "unnamed" if name == UNNAMED else "graph"
        elif is_identity(name):
            kernel = (p["name"], p["grid"], p["block"], p["smem"])
            consistent = name not in bad_identities and kernel not in bad_kernels
            outcome[j] = "identified_consistently" if consistent else "identity_inconsistent"
        elif p["name"] in forms.get(name, {name}):
            outcome[j] = "named_equal"
        else:
            outcome[j] = "named_different"
    counts = collections.Counter(outcome)
    matched = counts["named_equal"] + counts["identified_consistently"]

    misses = {}
    for j, what in enumerate(outcome):
        if what in ("named_equal", "identified_consistently"):
            continue
        p = prof[j]
        row = misses.setdefault(
            p["name"],
            {
                "profiler_name": p["name"],
                "first_at": start + j,
                "misses": 0,
                "how": collections.Counter(),
                "agent_gave": collections.Counter(),
                "configs": collections.Counter(),
            },
        )
        row["misses"] += 1
        row["how"][what] += 1
        if agent_of[j] is not None:
            row["agent_gave"][agent_of[j]] += 1
        row["configs"][f"g{p['grid']} b{p['block']} smem {p['smem']}"] += 1
    miss_rows = sorted(misses.values(), key=lambda r: (-r["misses"], r["first_at"]))
    for r in miss_rows:
        r["how"] = dict(r["how"])
        r["agent_gave"] = dict(r["agent_gave"].most_common(3))
        r["configs"] = dict(r["configs"].most_common(3))

    share = matched / len(prof)
    verdict = {
        "case": case_label(case),
        "status": "ok" if share >= TARGET else "below_target",
        "target": TARGET,
        "share_matched": round(share, 6),
        "device": profiler.get("device"),
        "cuda_visible_devices": profiler.get("cuda_visible_devices"),
        "torch": profiler.get("torch"),
        "cuda": profiler.get("cuda"),
        "workload_pid": pid,
        "launches": {
            "profiler": len(prof),
            "profiler_whole_run": len(prof_all),
            "profiler_scope": scope,
            "agent": len(agent),
            "aligned": len(pairs),
        },
        "alignment": how,
        "agent_source": agent_source,
        "named_equal": counts["named_equal"],
        "identified_consistently": counts["identified_consistently"],
        "unnamed": counts["unnamed"] + counts["graph"],
        "mismatched": counts["named_different"] + counts["identity_inconsistent"],
        "missing": counts["missing"],
        "agent_extra": len(agent) - len(pairs),
        "detail": {
            "named_different": counts["named_different"],
            "identity_inconsistent": counts["identity_inconsistent"],
            "graph": counts["graph"],
            "config_agrees": config_agrees,
            "config_checked": config_checked,
        },
        "identities": {
            "distinct": len(by_identity),
            "standing_for_several_names": [
                {"identity": n, "profiler_names": dict(by_identity[n].most_common(5))}
                for n in sorted(bad_identities)[:MISSES_SHOWN]
            ],
            "kernels_with_several_identities": [
                {
                    "profiler_name": k[0],
                    "grid": k[1],
                    "block": k[2],
                    "shared_memory": k[3],
                    "identities": dict(by_kernel[k].most_common(5)),
                }
                for k in sorted(bad_kernels, key=str)[:MISSES_SHOWN]
            ],
        },
        "misses": miss_rows[:MISSES_SHOWN],
        "miss_kinds": len(miss_rows),
        "demangler": demangler.available(),
        "agent": {
            "drops": capture.get("drops"),
            "counts": capture.get("counts"),
            "libraries": capture.get("libraries"),
            "launch_log_beyond_limit": capture.get("launch_log_beyond_limit"),
        },
        "profiler": {
            "without_launch_call": profiler.get("without_launch_call"),
            "gpu_order_differs_at": profiler.get("gpu_order_differs_at"),
            "attach_gap_s": profiler.get("attach_gap_s"),
        },
    }
    return verdict, OK if share >= TARGET else BELOW_TARGET


def failed(reason, case=None):
    return {"case": case, "status": "run_failed", "reason": reason, "target": TARGET}, RUN_FAILED


def skipped(reason, case=None):
    """A case this host cannot run (the devices case with one GPU): neither held nor failed."""
    return {"case": case, "status": "skipped", "reason": reason}, OK


def status_code(status):
    """The exit code a verdict's status stands for ("skipped" holds nothing up)."""
    return {"ok": OK, "skipped": OK, "below_target": BELOW_TARGET}.get(status, RUN_FAILED)


def combine(verdicts):
    code = OK
    cases = {}
    for v in verdicts:
        code = max(code, status_code(v.get("status")))
        cases[v.get("case") or f"case {len(cases)}"] = {
            k: v.get(k)
            for k in (
                "status",
                "reason",
                "share_matched",
                "launches",
                "named_equal",
                "identified_consistently",
                "unnamed",
                "mismatched",
                "missing",
            )
            if k in v
        }
    status = {OK: "ok", BELOW_TARGET: "below_target", RUN_FAILED: "run_failed"}[code]
    return {"status": status, "target": TARGET, "cases": cases}, code


def verdict_case_of(path):
    """The case a verdict file is for, from its name (verdict-graph.json: graph;
    verdict-late.json: late_attach)."""
    name = os.path.basename(path)
    name = name[: -len(".json")] if name.endswith(".json") else name
    return case_label(name[len("verdict-"):] if name.startswith("verdict-") else name)


def load_verdicts(paths):
    """The verdicts in `paths`; one that cannot be read is a failed run of its case."""
    out = []
    for path in paths:
        try:
            v = load_json(path, "verdict")
            if not isinstance(v, dict):
                raise RunFailed(f"verdict {path}: not a JSON object")
        except RunFailed as e:
            v, _ = failed(str(e), verdict_case_of(path))
        out.append(v)
    return out


DEVICE_FIELDS = ("by_uuid", "by_visible_devices", "single_visible")
UNATTRIBUTED = ("no_context", "stream_conflict", "unknown_ordinal", "unresolved_ordinal",
                "no_devices")


def counters_case(capture):
    """The counters case: a capture with the product's counter source (NVML/GPM) on this
    host's GPUs. It holds when launches were sampled, every sampled launch was attributed to a
    GPU (single_device counts on a one-GPU host), none lost to a device error or an
    unsupported counter group, and some got values (GPM refuses samples closer than its
    minimum interval: those are counted as too_soon, not failures). A verdict and its code."""
    counts = capture.get("counts") if isinstance(capture, dict) else None
    if not isinstance(counts, dict):
        return failed("the capture has no counts", "counters")
    devices = counts.get("devices") if isinstance(counts.get("devices"), dict) else {}
    missing = counts.get("samples_missing") if isinstance(counts.get("samples_missing"), dict) else {}
    unattributed = devices.get("unattributed") if isinstance(devices.get("unattributed"), dict) else {}

    def number(d, k):
        v = d.get(k, 0)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    sampled = number(counts, "sampled")
    with_values = number(counts, "samples_with_values")
    attributed = sum(number(devices, k) for k in DEVICE_FIELDS + ("single_device",))
    lost = sum(number(unattributed, k) for k in UNATTRIBUTED)
    errors = {k: number(missing, k) for k in ("device_error", "group_not_supported", "no_source")}
    verdict = {
        "case": "counters",
        "counter_source": capture.get("counter_source"),
        "launches": number(counts, "launches"),
        "sampled": sampled,
        "samples_with_values": with_values,
        "attributed": attributed,
        "unattributed": lost,
        "samples_missing": missing,
    }
    problems = []
    if sampled == 0:
        problems.append("no launch was sampled")
    if attributed != sampled or lost:
        problems.append(f"{attributed} of {sampled} sampled launches attributed, {lost} lost")
    if any(errors.values()):
        problems.append(f"samples lost to errors: {errors}")
    if with_values == 0:
        problems.append("no sample got counter values")
    verdict["status"] = "below_target" if problems else "ok"
    if problems:
        verdict["reason"] = "; ".join(problems)
    code = RUN_FAILED if sampled == 0 else (BELOW_TARGET if problems else OK)
    return verdict, code


def attribution(capture):
    """Whether the capture attributed every sampled launch to a GPU (the devices case):
    counts.devices.unattributed all 0 and by_uuid + by_visible_devices + single_visible equal
    to counts.sampled, which is above 0. A verdict and its exit code."""
    counts = capture.get("counts") if isinstance(capture, dict) else None
    devices = counts.get("devices") if isinstance(counts, dict) else None
    if not isinstance(devices, dict):
        return failed("the capture has no counts.devices (an agent without device attribution)",
                      "attribution")
    unattributed = devices.get("unattributed")
    unattributed = unattributed if isinstance(unattributed, dict) else {}

    def number(d, k):
        v = d.get(k, 0)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    sampled = counts.get("sampled")
    by = {k: number(devices, k) for k in DEVICE_FIELDS}
    lost = {k: number(unattributed, k) for k in UNATTRIBUTED}
    attributed = sum(by.values())
    verdict = {
        "case": "attribution",
        "sampled": sampled,
        "attributed": attributed,
        **by,
        "single_device": devices.get("single_device"),
        "unattributed": lost,
        "context_events": devices.get("context_events"),
        "entries_dropped": devices.get("entries_dropped"),
        "samples_missing": counts.get("samples_missing"),
    }
    problems = []
    code = OK
    if not isinstance(sampled, int) or isinstance(sampled, bool) or sampled <= 0:
        problems.append(f"no sampled launch to attribute (counts.sampled {sampled!r})")
        code = RUN_FAILED
    else:
        not_attributed = {k: v for k, v in lost.items() if v}
        if not_attributed:
            problems.append(
                f"{sum(not_attributed.values())} sampled launches not attributed ("
                + ", ".join(f"{k} {v}" for k, v in not_attributed.items())
                + ")"
            )
        if attributed != sampled:
            problems.append(
                f"by_uuid + by_visible_devices + single_visible = {attributed}, "
                f"not counts.sampled = {sampled}"
                + (f" (single_device {devices.get('single_device')})"
                   if devices.get("single_device") else "")
            )
        if problems:
            code = BELOW_TARGET
    verdict["status"] = {OK: "ok", BELOW_TARGET: "below_target"}.get(code, "run_failed")
    if problems:
        verdict["reason"] = "; ".join(problems)
    return verdict, code


def devices_case(attr, parts):
    """The devices case's verdict from the capture's attribution verdict (`attribution`, or a
    failed one when the capture could not be read) and its workloads' verdicts (devices-0,
    devices-1; kept in full, so that this one file says everything): it holds when all do."""
    code = status_code(attr.get("status"))
    reasons = []
    workloads = {}
    for v in parts:
        name = v.get("case") or f"workload {len(workloads)}"
        workloads[name] = v
        this = status_code(v.get("status"))
        code = max(code, this)
        if this != OK or v.get("status") == "skipped":
            share = v.get("share_matched")
            reasons.append(
                f"{name}: {v.get('status')}"
                + (f", {share:.2%} matched" if isinstance(share, (int, float)) else "")
                + (f" ({v['reason']})" if v.get("reason") else "")
            )
    if not workloads or any(v.get("status") == "skipped" for v in workloads.values()):
        # A workload of this case is never skipped: the case runs both or is skipped whole.
        code = RUN_FAILED
        if not workloads:
            reasons.append("no workload verdict")
    if status_code(attr.get("status")) != OK:
        reasons.append(f"attribution: {attr.get('reason') or attr.get('status')}")
    shares = [v.get("share_matched") for v in workloads.values()]
    verdict = {
        "case": "devices",
        "status": {OK: "ok", BELOW_TARGET: "below_target"}.get(code, "run_failed"),
        "target": TARGET,
    }
    if reasons:
        verdict["reason"] = "; ".join(reasons)
    if shares and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in shares):
        verdict["share_matched"] = min(shares)
    verdict["attribution"] = attr
    verdict["workloads"] = workloads
    return verdict, code


def agent_log_notes(path, limit=20):
    """The agent log's lines worth reading next to the verdict (late naming, warnings)."""
    notes = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if re.search(r"named from|WARN|ERROR|error:|libraries|no libcuda", line):
                    notes.append(re.sub(r"\x1b\[[0-9;]*m", "", line.rstrip())[:400])
                    if len(notes) >= limit:
                        break
    except OSError:
        pass
    return notes


# ---------------------------------------------------------------------------------------------
# Self-test (no GPU, no agent): synthetic captures and profiles


def _fake_demangler():
    table = {"_Z6kernelPf": "kernel(float*)", "_Z4normPKfPf": "norm(float const*, float*)"}

    class Fake(Demangler):
        def __init__(self):
            self.cxxfilt = self.cuxxfilt = self.cxa = None

        def available(self):
            return ["table"]

        def forms(self, names):
            return {n: {n, table[n]} if n in table else {n} for n in names}

    return Fake()


def _prof_row(name, grid, block=(128, 1, 1), smem=0):
    return {"name": name, "grid": list(grid), "block": list(block), "shared_memory": smem}


def _log_row(pid, name, grid, block=(128, 1, 1), smem=0):
    return {"pid": pid, "name": name, "grid": list(grid), "block": list(block), "smem": smem}


def self_test():
    checks = []

    def check(what, cond):
        checks.append(what)
        if not cond:
            raise AssertionError(what)

    pid = 4242
    gemm_id = "<bid:ab12+0x10 g4x1x1 b128x1x1 s0>"
    other_id = "<bid:ab12+0x20 g8x1x1 b128x1x1 s0>"
    # One iteration of the synthetic workload: (profiler name, agent name, grid).
    iteration = [
        ("kernel(float*)", "_Z6kernelPf", (1, 1, 1)),  # mangled vs demangled
        ("norm(float const*, float*)", "_Z4normPKfPf", (2, 1, 1)),
        ("sm90_gemm_a", gemm_id, (4, 1, 1)),  # identity, consistent
        ("plain_c_kernel", "plain_c_kernel", (3, 1, 1)),  # named, not mangled
    ]
    prof_rows, log_rows = [], []
    for _ in range(50):
        for pname, aname, grid in iteration:
            prof_rows.append(_prof_row(pname, grid))
            log_rows.append(_log_row(pid, aname, grid))
    profiler = {"pid": pid, "launches": prof_rows, "device": "synthetic"}
    capture = {"launch_log": log_rows, "snippets": [], "drops": 0}
    fake = _fake_demangler()

    # The counters case, as the H200 run of 2026-12-04 gave it: one GPU, GPM's minimum
    # interval refusing most samples, four with values.
    h200 = {"counter_source": "nvml", "counts": {
        "launches": 1820, "sampled": 37, "samples_with_values": 4,
        "samples_missing": {"too_soon": 33, "device_error": 0, "group_not_supported": 0},
        "devices": {"single_device": 37, "by_uuid": 0, "unattributed": {"no_context": 0}}}}
    v, code = counters_case(h200)
    check("counters: one GPU, some values: ok", code == OK and v["status"] == "ok")
    h200["counts"]["samples_with_values"] = 0
    check("counters: no values: below target", counters_case(h200)[1] == BELOW_TARGET)
    h200["counts"]["samples_with_values"] = 4
    h200["counts"]["devices"]["unattributed"]["no_context"] = 2
    check("counters: unattributed: below target", counters_case(h200)[1] == BELOW_TARGET)
    h200["counts"]["sampled"] = 0
    check("counters: nothing sampled: run failed", counters_case(h200)[1] == RUN_FAILED)
    check("counters: a case name", case_arg("counters") == "counters")

    v, code = compare(capture, profiler, "attached", fake)
    check("all matched: exit 0", code == OK and v["share_matched"] == 1.0)
    check("positional alignment", v["alignment"] == "positional")
    check("named and equal, mangled or not", v["named_equal"] == 150)
    check("identified consistently", v["identified_consistently"] == 50)
    check("no misses", v["misses"] == [] and v["missing"] == 0)

    # A launch of another process is not the workload's.
    other = dict(capture, launch_log=log_rows + [_log_row(pid + 1, "x", (9, 9, 9))])
    v, code = compare(other, profiler, "attached", fake)
    check("other pids ignored", v["launches"]["agent"] == 200 and code == OK)

    # The same identity standing for two profiler names: every launch of it is a mismatch.
    bad_prof = [dict(r) for r in prof_rows]
    bad_log = [dict(r) for r in log_rows]
    for k in (2, 6):
        bad_prof[k]["name"] = "sm90_gemm_b" if k == 6 else "sm90_gemm_a"
    v, code = compare(dict(capture, launch_log=bad_log), dict(profiler, launches=bad_prof),
                      "attached", fake)
    check("inconsistent identity mismatched", v["detail"]["identity_inconsistent"] == 50)
    check("inconsistent identity reported",
          v["identities"]["standing_for_several_names"][0]["identity"] == gemm_id)
    check("75% matched: exit 1", code == BELOW_TARGET and v["share_matched"] == 0.75)
    check("misses name the kernels",
          {r["profiler_name"] for r in v["misses"]} == {"sm90_gemm_a", "sm90_gemm_b"})

    # One kernel (name and configuration) given two identities: the bijection breaks.
    two = [dict(r) for r in log_rows]
    two[2 + 4 * 7]["name"] = other_id.replace("g8x1x1", "g4x1x1")
    v, code = compare(dict(capture, launch_log=two), profiler, "attached", fake)
    check("kernel with two identities reported",
          len(v["identities"]["kernels_with_several_identities"]) == 1)
    check("kernel with two identities not matched", v["detail"]["identity_inconsistent"] == 50)

    # The same kernel with two configurations has two identities: no violation.
    cfg_prof = [dict(r) for r in prof_rows]
    cfg_log = [dict(r) for r in log_rows]
    cfg_prof[2]["grid"] = [8, 1, 1]
    cfg_log[2] = _log_row(pid, other_id, (8, 1, 1))
    v, code = compare(dict(capture, launch_log=cfg_log), dict(profiler, launches=cfg_prof),
                      "attached", fake)
    check("two configurations, two identities, all matched",
          code == OK and v["identified_consistently"] == 50 and v["identities"]["distinct"] == 2)

    # Missing launches and unnamed ones.
    holes = [dict(r) for r in log_rows]
    del holes[101]  # the agent missed one launch
    holes[10]["name"] = UNNAMED
    holes[14]["name"] = GRAPH
    v, code = compare(dict(capture, launch_log=holes), profiler, "attached", fake)
    check("unequal lengths align exactly",
          v["alignment"] == "longest common subsequence on (grid, block)")
    check("one missing, rest aligned", v["missing"] == 1 and v["launches"]["aligned"] == 199)
    check("the missing one is where it was",
          any(r["how"] == {"missing": 1} and r["first_at"] == 101 for r in v["misses"]))
    check("unnamed and graph", v["unnamed"] == 2 and v["detail"]["graph"] == 1)
    check("197 of 200 is below 99%", code == BELOW_TARGET and v["share_matched"] == 0.985)
    holes2 = [dict(r) for r in log_rows]
    del holes2[101]
    v, code = compare(dict(capture, launch_log=holes2), profiler, "attached", fake)
    check("199 of 200 holds the target", code == OK and v["missing"] == 1)

    # A wrong name.
    wrong = [dict(r) for r in log_rows]
    wrong[0]["name"] = "_Z5otherPf"
    v, code = compare(dict(capture, launch_log=wrong), profiler, "attached", fake)
    check("a wrong name is mismatched", v["detail"]["named_different"] == 1)
    check("its row says what the agent gave",
          v["misses"][0]["agent_gave"] == {"_Z5otherPf": 1})

    # Without the demangler, a mangled name does not equal the profiler's.
    bare = Demangler(use_cxxfilt=False, use_cxa=False)
    v, code = compare(capture, profiler, "attached", bare)
    check("mangled names need demangling", v["detail"]["named_different"] == 100)

    # The real demanglers, where present, give the profiler's form.
    real = Demangler()
    if real.available():
        forms = real.forms(["_Z6kernelPf", "plain"])
        check("real demangler", "kernel(float*)" in forms["_Z6kernelPf"])
        check("plain names unchanged", forms["plain"] == {"plain"})
        v, code = compare(capture, profiler, "attached", real)
        check("real demangler: all matched", code == OK and v["named_equal"] == 150)

    # Late attach: only the launches after the agent attached count, and the agent saw those.
    late_prof = dict(profiler, after_attach=80, mode="late")
    v, code = compare(dict(capture, launch_log=log_rows[80:]), late_prof, "late", fake)
    check("late: scope after the gap", v["launches"]["profiler"] == 120)
    check("late: all matched", code == OK and v["case"] == "late_attach")
    # The agent attached late and missed the first launches after the gap too.
    v, code = compare(dict(capture, launch_log=log_rows[84:]), late_prof, "late", fake)
    check("late: the first four missing", v["missing"] == 4 and v["launches"]["aligned"] == 116)
    check("late: missing at the start", min(r["first_at"] for r in v["misses"]) == 80)
    check("late: aligned at the end", v["alignment"] == "positional, at the end")
    # No gap found: the agent's sequence aligns as a suffix of the whole run.
    v, code = compare(dict(capture, launch_log=log_rows[80:]), profiler, "late", fake)
    check("late without a gap: suffix aligned",
          v["launches"]["aligned"] == 120 and v["missing"] == 80
          and max(r["first_at"] for r in v["misses"]) < 80)

    # The graph case aligns like attached (the agent started first) and keeps its name.
    v, code = compare(capture, profiler, "graph", fake)
    check("graph: named graph, aligned like attached",
          code == OK and v["case"] == "graph" and v["alignment"] == "positional")
    check("case names", [case_label(c) for c in ("attached", "late", "graph", "devices-1")]
          == ["attached", "late_attach", "graph", "devices-1"])

    # The devices case: two workloads' launches interleaved in one capture; each verdict takes
    # its own workload's pid from its profiler output.
    pid_b = pid + 100
    both = []
    for a, b in zip(log_rows, log_rows[::-1]):
        both += [a, dict(b, pid=pid_b)]
    profiler_b = dict(profiler, pid=pid_b, launches=prof_rows[::-1])
    v, code = compare(dict(capture, launch_log=both), profiler, "devices-0", fake)
    check("devices: first workload's own launches",
          code == OK and v["case"] == "devices-0" and v["launches"]["agent"] == 200
          and v["alignment"] == "positional")
    v, code = compare(dict(capture, launch_log=both), profiler_b, "devices-1", fake)
    check("devices: second workload's own launches",
          code == OK and v["case"] == "devices-1" and v["named_equal"] == 150)

    # Device attribution: every sampled launch attributed, none lost.
    def device_counts(sampled, by_uuid=0, visible=0, single_visible=0, single_device=0,
                      **unattributed):
        lost = dict.fromkeys(UNATTRIBUTED, 0)
        lost.update(unattributed)
        return {"counts": {"sampled": sampled, "samples_missing": {"group_not_supported": 0},
                           "devices": {"context_events": 4, "entries_dropped": 0,
                                       "by_uuid": by_uuid, "by_visible_devices": visible,
                                       "single_device": single_device,
                                       "single_visible": single_visible,
                                       "unattributed": lost}}}

    attributed_all = device_counts(40, by_uuid=30, visible=8, single_visible=2)
    v, code = attribution(attributed_all)
    check("attribution: all attributed holds",
          code == OK and v["status"] == "ok" and v["attributed"] == 40 and "reason" not in v)
    v, code = attribution(device_counts(41, by_uuid=30, visible=8, single_visible=2,
                                        no_context=1))
    check("attribution: one without a context fails",
          code == BELOW_TARGET and "no_context 1" in v["reason"])
    v, code = attribution(device_counts(40, by_uuid=30, visible=8, single_visible=1,
                                        stream_conflict=1))
    check("attribution: a stream conflict fails, though the sum is short too",
          code == BELOW_TARGET and "stream_conflict 1" in v["reason"] and "= 39" in v["reason"])
    v, code = attribution(device_counts(40, by_uuid=20))
    check("attribution: sampled launches never attributed (no group read) fail",
          code == BELOW_TARGET and "not counts.sampled = 40" in v["reason"])
    v, code = attribution(device_counts(40, by_uuid=30, single_device=10))
    check("attribution: the host's only GPU does not count on a host with several",
          code == BELOW_TARGET and "single_device 10" in v["reason"])
    v, code = attribution(device_counts(0))
    check("attribution: no sampled launch is a failed run", code == RUN_FAILED)
    v, code = attribution({"counts": {"sampled": 5}})
    check("attribution: no counts.devices is a failed run", code == RUN_FAILED)

    # The devices case holds when both workloads and the attribution hold.
    ok_part = {"case": "devices-0", "status": "ok", "share_matched": 1.0}
    low_part = {"case": "devices-1", "status": "below_target", "share_matched": 0.9}
    ok_attr = attribution(attributed_all)[0]
    v, code = devices_case(ok_attr, [ok_part, dict(ok_part, case="devices-1", share_matched=0.995)])
    check("devices case holds", code == OK and v["case"] == "devices"
          and v["share_matched"] == 0.995 and set(v["workloads"]) == {"devices-0", "devices-1"})
    v, code = devices_case(ok_attr, [ok_part, low_part])
    check("devices case: one workload below target",
          code == BELOW_TARGET and v["reason"].startswith("devices-1: below_target, 90.00%"))
    v, code = devices_case(attribution(device_counts(3, unknown_ordinal=3))[0],
                           [ok_part, dict(ok_part, case="devices-1")])
    check("devices case: attribution fails it",
          code == BELOW_TARGET and "attribution: 3 sampled" in v["reason"])
    v, code = devices_case(ok_attr, [ok_part, failed("the workload exited 1", "devices-1")[0]])
    check("devices case: a failed workload", code == RUN_FAILED)
    v, code = devices_case(ok_attr, [])
    check("devices case: no workload verdict", code == RUN_FAILED)

    # A skipped case neither fails nor holds the others up.
    skip = skipped("one GPU on this host", "devices")[0]
    check("skipped verdict", skip == {"case": "devices", "status": "skipped",
                                      "reason": "one GPU on this host"})
    v, code = combine([{"case": "attached", "status": "ok"}, skip])
    check("combine: skipped and ok is ok", code == OK and v["status"] == "ok"
          and v["cases"]["devices"]["status"] == "skipped")
    v, code = combine([{"case": "attached", "status": "below_target"}, skip])
    check("combine: skipped and below target", code == BELOW_TARGET)
    v, code = combine([{"case": "attached", "status": "weird"}, skip])
    check("combine: an unknown status is a failed run", code == RUN_FAILED)

    # An agent without a launch log: the snippets' names (identities carry configurations).
    snippets = [
        {"pid": pid, "window": 1, "all_names": [r["name"] for r in log_rows[100:]]},
        {"pid": pid, "window": 0, "all_names": [r["name"] for r in log_rows[:100]]},
    ]
    v, code = compare({"snippets": snippets}, profiler, "attached", fake)
    check("snippets in window order", code == OK and v["agent_source"] == "snippets.all_names")

    # The alignment itself: an exact longest common subsequence (checked against dynamic
    # programming on small random sequences), and right on a workload's repeated iterations
    # with launches lost and inserted, where greedy block matching goes astray.
    import random

    rng = random.Random(7)

    def lcs_length(a, b):
        row = [0] * (len(b) + 1)
        for x in reversed(a):
            new = [0] * (len(b) + 1)
            for j in range(len(b) - 1, -1, -1):
                new[j] = row[j + 1] + 1 if x == b[j] else max(row[j], new[j + 1])
            row = new
        return row[0]

    exact = True
    for _ in range(200):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 25))]
        b = [rng.randint(0, 3) for _ in range(rng.randint(0, 25))]
        pairs = lcs_pairs(a, b, 100)
        exact &= len(pairs) == lcs_length(a, b) and all(a[i] == b[j] for i, j in pairs)
        exact &= all(p < q for p, q in zip(pairs, pairs[1:]))
    check("longest common subsequence is exact", exact)
    check("too many edits gives up", lcs_pairs([1] * 50, [2] * 50, 10) is None)
    check("equal gaps are paired", fill_equal_gaps([(1, 1)], 3, 3) == [(0, 0), (1, 1), (2, 2)])
    period = [((rng.randint(1, 40), 1, 1), (128, 1, 1)) for _ in range(150)]
    prof_seq = [{"grid": g, "block": b, "at": n} for n, (g, b) in enumerate(period * 20)]
    agent_seq = [dict(p) for p in prof_seq]
    for _ in range(30):
        del agent_seq[rng.randrange(len(agent_seq))]
    for _ in range(10):
        agent_seq.insert(rng.randrange(len(agent_seq)),
                         {"grid": (9999, 1, 1), "block": (1, 1, 1), "at": None})
    pairs, how = align(agent_seq, prof_seq)
    right = sum(agent_seq[i]["at"] == j for i, j in pairs)
    check("repeated iterations align", how.startswith("longest") and right >= 2970 - 10)

    # The whole command line, through files: verdicts, exit codes, combination, failures.
    with tempfile.TemporaryDirectory() as tmp:
        def write(name, doc):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                json.dump(doc, f)
            return path

        cap = write("capture.json", capture)
        prof = write("profiler.json", profiler)
        me = os.path.abspath(__file__)
        run = lambda *a: subprocess.run([sys.executable, me, *a], capture_output=True, text=True)  # noqa: E731
        r = run(cap, prof)
        check("cli: exit 0", r.returncode == OK)
        good = write("good.json", json.loads(r.stdout))
        r = run(cap, write("empty.json", {"pid": pid, "launches": []}))
        check("cli: no launches is a failed run", r.returncode == RUN_FAILED)
        r = run(os.path.join(tmp, "absent.json"), prof, "--case", "late")
        check("cli: missing capture is a failed run",
              r.returncode == RUN_FAILED and json.loads(r.stdout)["case"] == "late_attach")
        bad = write("bad.json", json.loads(r.stdout))
        r = run("--failed", "torch is not installed", "--case", "attached")
        check("cli: --failed", r.returncode == RUN_FAILED
              and json.loads(r.stdout)["reason"] == "torch is not installed")
        r = run("--combine", good, good)
        check("cli: combine ok", r.returncode == OK)
        r = run("--combine", good, bad)
        check("cli: combine with a failed run", r.returncode == RUN_FAILED)

        # The graph case on the command line (argparse refused it before).
        r = run(cap, prof, "--case", "graph")
        check("cli: --case graph gives a graph verdict",
              r.returncode == OK and json.loads(r.stdout)["case"] == "graph")
        graph = write("verdict-graph.json", json.loads(r.stdout))
        r = run("--failed", "the workload exited 1", "--case", "graph")
        check("cli: --failed --case graph",
              r.returncode == RUN_FAILED and json.loads(r.stdout)["case"] == "graph")
        failed_graph = write("failed-graph.json", json.loads(r.stdout))
        r = run("--combine", good, graph)
        check("cli: combine with graph",
              r.returncode == OK and set(json.loads(r.stdout)["cases"]) == {"attached", "graph"})
        r = run("--combine", good, failed_graph)
        check("cli: combine with a failed graph run", r.returncode == RUN_FAILED
              and json.loads(r.stdout)["cases"]["graph"]["status"] == "run_failed")
        r = run(cap, prof, "--case", "sideways")
        check("cli: an unknown case is refused", r.returncode == 2 and not r.stdout)

        # Skipped, and a verdict file that is not there.
        r = run("--skipped", "one GPU on this host", "--case", "devices")
        check("cli: --skipped", r.returncode == OK and json.loads(r.stdout)
              == {"case": "devices", "status": "skipped", "reason": "one GPU on this host"})
        skipped_devices = write("verdict-devices.json", json.loads(r.stdout))
        r = run("--combine", good, graph, skipped_devices)
        check("cli: combine with a skipped case is ok",
              r.returncode == OK and json.loads(r.stdout)["status"] == "ok")
        r = run("--combine", good, os.path.join(tmp, "verdict-late.json"))
        out = json.loads(r.stdout) if r.stdout else {}
        check("cli: combine with a missing verdict file keeps the others",
              r.returncode == RUN_FAILED and out["cases"]["attached"]["status"] == "ok"
              and out["cases"]["late_attach"]["status"] == "run_failed")

        # The devices case: two workloads in one capture, each with its own profiler output.
        two_cap = write("capture-devices.json",
                        dict(capture, launch_log=both, counts=attributed_all["counts"]))
        parts = []
        for n, p in enumerate((profiler, profiler_b)):
            r = run(two_cap, write(f"profiler-devices-{n}.json", p), "--case", f"devices-{n}")
            check(f"cli: devices-{n}", r.returncode == OK
                  and json.loads(r.stdout)["case"] == f"devices-{n}")
            parts.append(write(f"verdict-devices-{n}.json", json.loads(r.stdout)))
        r = run(two_cap, "--devices", *parts)
        out = json.loads(r.stdout)
        check("cli: --devices holds", r.returncode == OK and out["case"] == "devices"
              and out["attribution"]["status"] == "ok" and len(out["workloads"]) == 2)
        devices_ok = write("devices-ok.json", out)
        r = run("--combine", good, graph, devices_ok)
        check("cli: combine with the devices case", r.returncode == OK
              and json.loads(r.stdout)["cases"]["devices"]["status"] == "ok")
        lost = write("capture-lost.json", dict(capture, launch_log=both,
                                               counts=device_counts(9, by_uuid=8,
                                                                    no_context=1)["counts"]))
        r = run(lost, "--devices", *parts)
        check("cli: --devices with an unattributed launch", r.returncode == BELOW_TARGET
              and json.loads(r.stdout)["attribution"]["unattributed"]["no_context"] == 1)
        r = run(two_cap, "--devices", parts[0], os.path.join(tmp, "verdict-devices-9.json"))
        check("cli: --devices with a missing workload verdict", r.returncode == RUN_FAILED
              and json.loads(r.stdout)["workloads"]["devices-9"]["status"] == "run_failed")
        r = run(os.path.join(tmp, "absent.json"), "--devices", *parts)
        check("cli: --devices without a capture", r.returncode == RUN_FAILED
              and json.loads(r.stdout)["attribution"]["status"] == "run_failed")
        r = run("--failed", "the agent could not open NVML/GPM (agent-devices.log)",
                "--case", "devices")
        check("cli: --failed --case devices",
              r.returncode == RUN_FAILED and json.loads(r.stdout)["case"] == "devices")
    print(json.dumps({"self_test": "ok", "checks": len(checks)}))
    return OK


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capture", nargs="?")
    parser.add_argument("profiler", nargs="?")
    parser.add_argument("--case", type=case_arg, default="attached",
                        help="attached, late, graph, devices or devices-N")
    parser.add_argument("--agent-log")
    parser.add_argument("--combine", nargs="+", metavar="VERDICT")
    parser.add_argument("--devices", nargs="+", metavar="VERDICT",
                        help="the devices case: its workloads' verdicts and CAPTURE_JSON's "
                        "device attribution")
    parser.add_argument("--counters", action="store_true",
                        help="the counters case: CAPTURE_JSON's samples and their attribution")
    parser.add_argument("--failed", metavar="REASON")
    parser.add_argument("--skipped", metavar="REASON")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    case_name = case_label(args.case)
    if args.self_test:
        return self_test()
    if args.failed is not None:
        verdict, code = failed(args.failed, case_name)
    elif args.skipped is not None:
        verdict, code = skipped(args.skipped, case_name)
    elif args.combine:
        verdict, code = combine(load_verdicts(args.combine))
    elif args.counters:
        if not args.capture or args.profiler:
            parser.error("--counters takes CAPTURE_JSON and no PROFILER_JSON")
        try:
            verdict, code = counters_case(load_json(args.capture, "capture"))
        except RunFailed as e:
            verdict, code = failed(str(e), "counters")
    elif args.devices:
        if not args.capture or args.profiler:
            parser.error("--devices takes CAPTURE_JSON and no PROFILER_JSON")
        try:
            attr, _ = attribution(load_json(args.capture, "capture"))
        except RunFailed as e:
            attr, _ = failed(str(e), "attribution")
        verdict, code = devices_case(attr, load_verdicts(args.devices))
    else:
        if not args.capture or not args.profiler:
            parser.error("give CAPTURE_JSON and PROFILER_JSON")
        try:
            capture = load_json(args.capture, "capture")
            profiler = load_json(args.profiler, "profiler output")
            verdict, code = compare(capture, profiler, args.case, Demangler())
        except RunFailed as e:
            verdict, code = failed(str(e), case_name)
        if args.agent_log:
            verdict["agent_log"] = agent_log_notes(args.agent_log)
    print(json.dumps(verdict, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
