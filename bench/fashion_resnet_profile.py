#!/usr/bin/python3
"""Where a step of examples/cpp's model goes: torch's profiler over the PyTorch side.

    .venv-torch2/bin/python bench/fashion_resnet_profile.py \\
        [--steps 30] [--batch-size 64]

One process, one intra-op thread, no DDP (what both sides share): bench/fashion_resnet.py's
model, data, SGD and batch; prints the ATen operators by self CPU time, the operators'
total per step, and the step's wall time (the difference is Python's and autograd's own
cost, which a LibTorch program does not pay, or pays less of).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fashion_resnet import ResNet, load  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = 64 * a.batch_size
    x, y = load("/usr/share/datasets/fashion-mnist", "train", n)
    model = ResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    def step(i):
        idx = torch.arange(i * a.batch_size, (i + 1) * a.batch_size) % n
        loss = F.cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx))
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()

    for i in range(5):
        step(i)
    start = time.perf_counter()
    for i in range(a.steps):
        step(i)
    wall_ms = (time.perf_counter() - start) * 1000 / a.steps
    with torch.autograd.profiler.profile() as prof:
        for i in range(a.steps):
            step(i)
    events = prof.key_averages()
    print(f"torch {torch.__version__}, batch {a.batch_size}, {a.steps} steps, 1 thread")
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))
    top = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::")) / 1000
    print(f"aten operators' self time: {top / a.steps:.2f} ms a step; "
          f"wall time without the profiler: {wall_ms:.2f} ms a step")


if __name__ == "__main__":
    main()
