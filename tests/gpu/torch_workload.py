"""A short PyTorch workload for the capture GPU check (issue: capture, "On a GPU").

Runs a few iterations of a small model on the GPU under torch.profiler and writes the CUDA
kernels the profiler saw, in order, to the JSON file named on the command line:
{"pid": ..., "kernels": [name, ...], "torch": ..., "cuda": ..., "device": ...}.
The agent, attached to the real libcuda before this starts, must see the same launches.
"""

import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def step(model, x):
    y = model(x)
    y = torch.nn.functional.layer_norm(y, y.shape[-1:])
    y = torch.softmax(y @ y.transpose(-1, -2), dim=-1)
    return y.sum()


def main():
    out = sys.argv[1]
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    device = torch.device("cuda")
    torch.cuda.init()
    # Everything that launches a kernel runs under the profiler, so that its list is the
    # process's whole list of launches.
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
        ).to(device)
        x = torch.randn(64, 256, device=device)
        for _ in range(iterations):
            loss = step(model, x)
            loss.backward()
        torch.cuda.synchronize()
    # Copies and fills are CUDA activity too, but not kernel launches.
    kernels = sorted(
        (
            e
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA
            and not e.name.startswith(("Memcpy", "Memset"))
        ),
        key=lambda e: e.time_range.start,
    )
    doc = {
        "pid": os.getpid(),
        "kernels": [e.name for e in kernels],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
    }
    with open(out, "w") as f:
        json.dump(doc, f)
    print(f"workload pid {os.getpid()}: {len(kernels)} kernels under the profiler")


if __name__ == "__main__":
    main()
