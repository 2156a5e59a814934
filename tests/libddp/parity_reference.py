#!/usr/bin/python3
"""PyTorch's own DDP on the setup of parity_program.cc: the per-step losses it must match.

    /usr/bin/python3 tests/libddp/parity_reference.py > tests/fixtures/libddp_parity.json

A small BatchNorm MLP with a frozen parameter, trained on seeded random data under
DistributedDataParallel (Gloo, CPU) with gradient accumulation through no_sync(),
clip_grad_norm_ and a linear warm-up into cosine annealing (SequentialLR), for 2 and 3
ranks. Each rank records its per-step loss (the mean over its micro-batches) and, after
each epoch, its validation loss over the whole set in eval mode under no_grad.
"""
import json
import os
import sys
from contextlib import nullcontext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ddp_test_ports import claim_port  # noqa: E402 (tests/common/ddp_test_ports.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_model import N, seeded_net_and_data  # noqa: E402

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

BATCH, ACCUM, EPOCHS = 6, 2, 3
LR, MOMENTUM, CLIP = 0.1, 0.9, 1.0
WARMUP, WARMUP_START, ETA_MIN = 2, 0.1, 0.001


def run(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    net, x_all, y_all = seeded_net_and_data()
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sampler = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=0)
    micro = (len(sampler) + BATCH - 1) // BATCH
    steps = (micro + ACCUM - 1) // ACCUM
    total = steps * EPOCHS
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=WARMUP_START, total_iters=WARMUP),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - WARMUP, eta_min=ETA_MIN),
    ], milestones=[WARMUP])
    losses, lrs, val = [], [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        order = list(sampler)
        model.train()
        for step in range(steps):
            first = step * ACCUM
            n = min(ACCUM, micro - first)
            total_loss = 0.0
            for j in range(n):
                idx = order[(first + j) * BATCH:(first + j + 1) * BATCH]
                ctx = model.no_sync() if j < n - 1 else nullcontext()
                with ctx:
                    loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
                    (loss / n).backward()
                total_loss += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total_loss / n)
        model.eval()
        with torch.no_grad():
            val.append(F.cross_entropy(model(x_all), y_all).item())
    out[rank] = {"losses": losses, "lrs": lrs, "val": val}
    dist.destroy_process_group()


def free_port():
    # A port of this process's own, claimed against tests run beside it (ctest -j).
    return claim_port()


def main():
    result = {"torch": torch.__version__}
    for world in (2, 3):
        with mp.Manager() as manager:
            out = manager.dict()
            # Forked from this process, which has imported torch already (and run nothing in
            # it), rather than spawned: a spawned rank imports torch again, seconds of CPU
            # each, and the numbers are the same.
            mp.start_processes(run, args=(world, free_port(), out), nprocs=world,
                               start_method="fork")
            result[f"world_{world}"] = [out[r] for r in range(world)]
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
