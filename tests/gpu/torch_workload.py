"""A short PyTorch workload for the GPU check (ci/gpu-check.sh; issue 9 item 7).

It trains a small transformer-like block for a few iterations on the GPU under
torch.profiler: linear layers and batched matmuls (cuBLAS, and cuBLASLt under bf16 autocast),
layer norm, softmax, GELU, dropout, residual adds, cross entropy, forward and backward, and an
AdamW step (PyTorch's own kernels). Every kernel launch of the process happens under the
profiler, so its list is the process's whole list of launches.

    torch_workload.py --probe
        prints JSON about the host's PyTorch (version, CUDA, device, the CUDA runtime and
        driver files the process maps) and exits 0, or exits 2 when there is no usable GPU.
    torch_workload.py OUT_JSON [--iterations N] [--trace TRACE_JSON_GZ]
        runs N iterations (default 30).
    torch_workload.py OUT_JSON --late READY GO [--warmup N] [--iterations N]
        the late-attach case: runs N warm-up iterations (default 4), then writes its pid to
        READY and idles until the file GO exists (ci/gpu-check.sh creates it once the agent
        has attached), then runs N more iterations inside the annotation
        "penrose_gpu_check::after_attach". Those are the launches the agent could see: the
        first is the first launch call at or after the annotation's start ("after_attach");
        the idle time also leaves the largest gap between two launch calls in the trace
        ("after_attach_by_gap", used when the annotation is missing).

OUT_JSON: {"pid", "torch", "cuda", "device", "cuda_visible_devices" (the environment's, as the
devices case sets it), "mode", "launches": [{"name", "grid", "block",
"shared_memory", "correlation", "launch_ts_us", "launch_api", "launch_tid", "stream",
"order_from"}, ...], "kernels": [name, ...], "after_attach": index or null, ...}. Launches are
in launch order: sorted by the timestamp of the runtime (or driver) API call that launched the
kernel, found through the kernel's correlation id, not by when the kernel ran on the GPU. The
profiler reports static plus dynamic shared memory in one figure ("shared_memory"); the
driver's launch call carries only the dynamic part.
"""

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

# Exit code when the run itself cannot happen (no torch, no GPU), as compare.py uses it.
RUN_FAILED = 2

# The annotation around the launches after the agent attached (late case).
AFTER_ATTACH = "penrose_gpu_check::after_attach"

# Chrome-trace categories of the host calls that launch GPU work (as penrose-traces reads them).
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver", "runtime")


def mapped_files(*stems):
    """Paths of the files this process maps whose names start with one of `stems`."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            name = os.path.basename(path)
            if path.startswith("/") and name.startswith(stems) and path not in found:
                found.append(path)
    return found


def probe():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means no torch here
        print(json.dumps({"torch": None, "error": f"import torch: {e}"}))
        return RUN_FAILED
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if not info["cuda_available"]:
        info["error"] = "torch.cuda.is_available() is false"
        print(json.dumps(info))
        return RUN_FAILED
    torch.cuda.init()
    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    info["device"] = torch.cuda.get_device_name()
    info["capability"] = list(torch.cuda.get_device_capability())
    info["cudart"] = mapped_files("libcudart.so")
    info["libcuda"] = mapped_files("libcuda.so")
    info["cublas"] = mapped_files("libcublas.so", "libcublasLt.so")
    print(json.dumps(info))
    return 0


class Block:
    """A pre-norm transformer block and a classifier head, with its optimiser."""

    def __init__(self, torch, device, width=256, heads=4, seq=64, batch=8, classes=512):
        nn = torch.nn
        self.torch = torch
        self.heads, self.seq, self.batch, self.classes = heads, seq, batch, classes
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.head = nn.Linear(width, classes)
        self.drop = nn.Dropout(0.1)
        self.modules = nn.ModuleList(
            [self.norm1, self.qkv, self.proj, self.norm2, self.up, self.down, self.head]
        ).to(device)
        self.optimizer = torch.optim.AdamW(self.modules.parameters(), lr=1e-3)
        self.x = torch.randn(batch, seq, width, device=device)
        self.target = torch.randint(0, classes, (batch * seq,), device=device)

    def attention(self, h):
        torch = self.torch
        b, s, w = h.shape
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        split = lambda t: t.reshape(b, s, self.heads, w // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (w // self.heads) ** 0.5
        attn = self.drop(torch.softmax(scores, dim=-1))
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, w)
        return self.proj(out)

    def forward(self, x):
        """The block's forward pass without loss or optimiser: what a serving stack replays."""
        torch = self.torch
        h = x + self.attention(self.norm1(x))
        h = h + self.down(torch.nn.functional.gelu(self.up(self.norm2(h))))
        return self.head(h)

    def step(self, autocast):
        torch = self.torch
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            h = self.x + self.attention(self.norm1(self.x))
            h = h + self.down(self.drop(torch.nn.functional.gelu(self.up(self.norm2(h)))))
            logits = self.head(h).reshape(-1, self.classes)
            loss = torch.nn.functional.cross_entropy(logits.float(), self.target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss


def graph_replays(torch, block, iterations):
    """The block's forward pass (inference, no autocast) captured once with torch.cuda.graphs
    and replayed `iterations` times: every replay is one cudaGraphLaunch whose kernels the
    profiler records under that launch's correlation id, and which the agent must expand into
    the same kernels (issue 24)."""
    static_x = block.x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        # Warm-up outside the capture, as torch.cuda.graphs asks (lazy init, cuBLAS handles).
        for _ in range(3):
            block.forward(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        block.forward(static_x)
    torch.cuda.synchronize()
    with torch.profiler.record_function(AFTER_ATTACH):
        for _ in range(iterations):
            graph.replay()
        torch.cuda.synchronize()


def launches_in_order(trace):
    """The kernel launches of a chrome trace that torch.profiler exported, in launch order.

    A kernel event carries its correlation id; the runtime or driver API call that launched
    it carries the same id, and its timestamp is the launch's. Kernels whose call is missing
    keep their own (GPU) timestamp and say so in "order_from".
    """
    events = trace.get("traceEvents", [])
    calls = {}
    kernels = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") or {}
        correlation = args.get("correlation")
        if cat == "kernel":
            kernels.append(e)
        elif cat in LAUNCH_CATEGORIES and correlation is not None:
            known = calls.get(correlation)
            if known is None or float(e["ts"]) < float(known["ts"]):
                calls[correlation] = e
    rows = []
    for e in kernels:
        args = e.get("args") or {}
        correlation = args.get("correlation")
        call = calls.get(correlation)
        rows.append(
            {
                "name": e.get("name"),
                "grid": args.get("grid"),
                "block": args.get("block"),
                "shared_memory": args.get("shared memory"),
                "correlation": correlation,
                "launch_ts_us": float(call["ts"]) if call else float(e["ts"]),
                "launch_api": call.get("name") if call else None,
                "launch_tid": call.get("tid") if call else None,
                "stream": args.get("stream"),
                "order_from": "launch_call" if call else "kernel",
                "gpu_ts_us": float(e["ts"]),
            }
        )
    rows.sort(key=lambda r: (r["launch_ts_us"], r["correlation"] or 0))
    return rows


def annotation_start(trace, name):
    """The timestamp of the CPU-side annotation `name` in a chrome trace, or None."""
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") == name:
            return float(e["ts"])
    return None


def first_at_or_after(rows, ts):
    """Index of the first launch whose call is at or after `ts`."""
    return next((i for i, r in enumerate(rows) if r["launch_ts_us"] >= ts), len(rows))


def largest_gap(rows):
    """Index of the first launch after the largest gap between launch calls, and the gap (s)."""
    best, at = 0.0, None
    for i in range(1, len(rows)):
        gap = rows[i]["launch_ts_us"] - rows[i - 1]["launch_ts_us"]
        if gap > best:
            best, at = gap, i
    return at, best / 1e6


def self_test():
    """Checks the trace reading on a synthetic chrome trace (no torch needed)."""

    def kernel(name, corr, ts, grid=(1, 1, 1)):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": 1,
                "args": {"correlation": corr, "grid": list(grid), "block": [128, 1, 1],
                         "shared memory": 256, "stream": 7}}

    def call(cat, name, corr, ts, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 1, "tid": tid,
                "args": {"correlation": corr}}

    trace = {"traceEvents": [
        kernel("B", 2, 50.0),  # ran first on the GPU (another stream), launched second
        kernel("A", 1, 100.0, grid=(4, 2, 1)),
        kernel("C", 3, 200.0),
        kernel("D", 4, 300.0),  # no launch call recorded
        call("cuda_runtime", "cudaLaunchKernel", 1, 10.0),
        call("cuda_runtime", "cudaLaunchKernelExC", 2, 20.0, tid=2),
        call("cuda_driver", "cuLaunchKernel", 3, 30.0),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 5.0,
         "args": {"correlation": 9}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "ts": 10.0, "id": 1,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "user_annotation", "name": AFTER_ATTACH, "ts": 25.0, "dur": 1000},
    ]}
    rows = launches_in_order(trace)
    assert [r["name"] for r in rows] == ["A", "B", "C", "D"], rows
    assert [r["order_from"] for r in rows] == ["launch_call"] * 3 + ["kernel"]
    assert [r["launch_api"] for r in rows] == [
        "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", None]
    assert rows[0]["grid"] == [4, 2, 1] and rows[0]["shared_memory"] == 256
    assert rows[1]["launch_tid"] == 2
    assert first_at_or_after(rows, annotation_start(trace, AFTER_ATTACH)) == 2
    assert annotation_start({"traceEvents": []}, AFTER_ATTACH) is None
    assert largest_gap(rows) == (3, 270.0 / 1e6)
    print(json.dumps({"self_test": "ok"}))
    return 0


def wait_for(path, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run(args):
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except Exception as e:  # noqa: BLE001
        print(f"import torch: {e}", file=sys.stderr)
        return RUN_FAILED
    if not torch.cuda.is_available():
        print("torch.cuda.is_available() is false", file=sys.stderr)
        return RUN_FAILED
    torch.manual_seed(0)
    device = torch.device("cuda")
    late = args.late is not None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        block = Block(torch, device)
        done = 0
        if args.graph:
            block.modules.eval()
            graph_replays(torch, block, args.iterations)
        elif late:
            ready, go = args.late
            for i in range(args.warmup):
                block.step(autocast=i % 2 == 1)
            torch.cuda.synchronize()
            done = args.warmup
            with open(ready + ".tmp", "w") as f:
                f.write(f"{os.getpid()}\n")
            os.replace(ready + ".tmp", ready)
            print(f"workload pid {os.getpid()}: {done} warm-up iterations, waiting for {go}")
            sys.stdout.flush()
            if not wait_for(go, args.wait_s):
                print(f"no {go} after {args.wait_s} s", file=sys.stderr)
                return RUN_FAILED
            # However soon the go came, leave a clear gap in the launch calls.
            time.sleep(2.0)
        if not args.graph:
            with torch.profiler.record_function(AFTER_ATTACH):
                for i in range(done, done + args.iterations):
                    block.step(autocast=i % 2 == 1)
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
        if args.trace:
            with open(path, "rb") as src, gzip.open(args.trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
    rows = launches_in_order(trace)
    after = by_gap = gap_s = by_annotation = None
    if late:
        # Where the later launches start: by the annotation around them, else by the idle gap
        # before them (both are kept, to show where they disagree).
        by_gap, gap_s = largest_gap(rows)
        ts = annotation_start(trace, AFTER_ATTACH)
        by_annotation = first_at_or_after(rows, ts) if ts is not None else None
        after = by_annotation if by_annotation is not None else by_gap
    gpu_order = sorted(range(len(rows)), key=lambda i: rows[i]["gpu_ts_us"])
    doc = {
        "pid": os.getpid(),
        "mode": "graph" if args.graph else ("late" if late else "attached"),
        "graph_launches": sum(1 for r in rows if r["launch_api"] and "GraphLaunch" in r["launch_api"]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "iterations": args.iterations,
        "warmup": args.warmup if late else 0,
        "launches": rows,
        "kernels": [r["name"] for r in rows],
        "without_launch_call": sum(r["order_from"] != "launch_call" for r in rows),
        "gpu_order_differs_at": sum(i != j for i, j in enumerate(gpu_order)),
        "after_attach": after,
        "after_attach_by_annotation": by_annotation,
        "after_attach_by_gap": by_gap,
        "attach_gap_s": gap_s,
        "shared_memory_is": "static plus dynamic (kineto's 'shared memory')",
    }
    with open(args.out, "w") as f:
        json.dump(doc, f)
    print(
        f"workload pid {os.getpid()}: {len(rows)} kernel launches under the profiler"
        + (f", {len(rows) - after} after the agent attached (gap {gap_s:.1f} s)" if late and after else "")
    )
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the launches (JSON)")
    parser.add_argument("--probe", action="store_true", help="print the host's PyTorch facts")
    parser.add_argument("--self-test", action="store_true", help="check the trace reading")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--late", nargs=2, metavar=("READY", "GO"))
    parser.add_argument(
        "--graph",
        action="store_true",
        help="capture the block's forward pass in a CUDA graph and replay it --iterations times",
    )
    parser.add_argument("--wait-s", type=float, default=180.0)
    parser.add_argument("--trace", help="also keep the profiler's chrome trace here (gzip)")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if args.probe:
        return probe()
    if not args.out:
        parser.error("give OUT_JSON or --probe")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
