"""PyTorch's DDP side of bench/comm_hooks.py: bench/comm_hook_bench.cc's training in Python.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python bench/comm_hooks_pytorch.py HOOK STEPS

Prints {"steps", "step_ms" (median after the first 10), "bytes" (what the hook passed
to torch.distributed.all_reduce in the last step; 0 without a hook)}.
"""
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.utils.data import DistributedSampler


def main():
    hook, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    sent = [0]
    all_reduce = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        sent[0] += tensor.numel() * tensor.element_size()
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(16384, 64)
    y = torch.randint(0, 10, (16384,))
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))
    model = nn.parallel.DistributedDataParallel(net)
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        model.register_comm_hook(
            powersgd.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=10),
            powersgd.powerSGD_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    order = torch.tensor(list(DistributedSampler(range(16384))))
    ms, last = [], 0
    for step in range(steps):
        begin = (step * 32) % (len(order) - 32)
        t0 = time.perf_counter()
        idx = order[begin:begin + 32]
        sent[0] = 0
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= 10:
            ms.append((time.perf_counter() - t0) * 1e3)
            last = sent[0]
    print(json.dumps({"steps": steps, "step_ms": statistics.median(ms), "bytes": last}))
    dist.barrier()


if __name__ == "__main__":
    main()
