#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel on the setup of ddp_graph_program.cc.

    python3 tests/libddp/ddp_graph_reference.py WORLD CASE > out.json

Net (parameter indices: gate 0, then a, b, even, rank1, never, weight before bias, 1..10:
a module's own parameters come before its children's, in PyTorch and LibTorch) trains
under DistributedDataParallel (Gloo, CPU) on WORLD ranks for STEPS steps, SGD with
momentum (a parameter whose grad is None is skipped, so None and zeros differ), the
gradients set to None after each step. Parameters and inputs come from closed formulas,
no random generator. CASE:
  undefined  every module feeds the output, then a custom autograd Function (Gate)
             multiplies by `gate` and returns no gradient (None) for it unless
             (step + rank) % 3 == 0: some steps some ranks, step 1 no rank (world 2).
  unused     find_unused_parameters=True; `even` only on even steps, `rank1` only on
             rank 1, `never` never, and Gate as above.
  static     static_graph=True; `rank1` only on rank 1, `never` never, Gate always
             giving its gradient.
  error      no flag; `never` and `gate` unused: the second forward raises PyTorch's
             error, which is printed as "error".
  static_error  static_graph=True, but `even` only on even steps: the third forward
             raises PyTorch's "training graph has changed" error.
  checkpoint static_graph=True and activation checkpointing (reentrant): b and even run
             inside torch.utils.checkpoint, even once more outside it, so its gradient
             arrives twice per backward (once from the nested backward); `rank1` only on
             rank 1, `never` never.
Prints {"torch": version, "ranks": [per rank: losses, defined (per step, per parameter:
whether param.grad was defined after backward), params (final, flattened per
parameter), grads (the last step's, or None)]}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ddp_test_ports import claim_port  # noqa: E402 (tests/common/ddp_test_ports.py)

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

STEPS, BATCH = 5, 6


class Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g, give):
        ctx.save_for_backward(x, g)
        ctx.give = give
        return x * g

    @staticmethod
    def backward(ctx, grad):
        x, g = ctx.saved_tensors
        return grad * g, ((grad * x).sum(0) if ctx.give else None), None


class Net(nn.Module):
    def __init__(self, case):
        super().__init__()
        self.case = case
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 3)
        self.even = nn.Linear(8, 3)
        self.rank1 = nn.Linear(8, 3)
        self.never = nn.Linear(8, 3)
        self.gate = nn.Parameter(torch.ones(3))
        with torch.no_grad():
            for k, p in enumerate(self.parameters()):
                p.copy_(formula_param(p.numel(), k).view(p.shape))

    def forward(self, x, step, rank):
        h = F.relu(self.a(x))
        out = self.b(h)
        if self.case == "undefined":
            out = out + self.even(h) + self.rank1(h) + self.never(h)
            return Gate.apply(out, self.gate, (step + rank) % 3 == 0)
        if self.case == "checkpoint":
            out = torch.utils.checkpoint.checkpoint(self.segment, h, use_reentrant=True)
            out = out + self.even(h)
            if rank == 1:
                out = out + self.rank1(h)
            return Gate.apply(out, self.gate, True)
        if self.case == "error":
            return out + self.even(h) + self.rank1(h)
        if self.case in ("unused", "static_error") and step % 2 == 0:
            out = out + self.even(h)
        if self.case == "static":
            out = out + self.even(h)
        if rank == 1:
            out = out + self.rank1(h)
        give = self.case.startswith("static") or (step + rank) % 3 == 0
        return Gate.apply(out, self.gate, give)

    def segment(self, h):
        out = self.b(h)
        return out + self.even(h)


def formula_param(numel, k):
    return (torch.sin(torch.arange(numel, dtype=torch.float64) * 0.37 + k) * 0.5).float()


def formula_batch(step, rank):
    i = torch.arange(BATCH * 4, dtype=torch.float64)
    x = torch.cos(i * 0.3 + step * 7 + rank * 13).float().view(BATCH, 4)
    j = torch.arange(BATCH * 3, dtype=torch.float64)
    y = torch.sin(j * 0.21 + step * 5 + rank * 3).float().view(BATCH, 3)
    return x, y


def run(rank, world, case, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    net = Net(case)
    kwargs = {}
    if case == "unused":
        kwargs["find_unused_parameters"] = True
    if case.startswith("static") or case == "checkpoint":
        kwargs["static_graph"] = True
    model = nn.parallel.DistributedDataParallel(net, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    result = {"losses": [], "defined": []}
    try:
        for step in range(STEPS):
            x, y = formula_batch(step, rank)
            loss = ((model(x, step, rank) - y) ** 2).mean()
            loss.backward()
            result["losses"].append(loss.item())
            result["defined"].append([int(p.grad is not None) for p in net.parameters()])
            if step == STEPS - 1:
                result["grads"] = [p.grad.view(-1).tolist() if p.grad is not None else None
                                   for p in net.parameters()]
            opt.step()
            opt.zero_grad(set_to_none=True)
    except RuntimeError as e:
        result["error"] = str(e)
    result["params"] = [p.detach().view(-1).tolist() for p in net.parameters()]
    out[rank] = result
    if "error" not in result:
        dist.destroy_process_group()


def free_port():
    # A port of this process's own, claimed against tests run beside it (ctest -j).
    return claim_port()


def main():
    world, case = int(sys.argv[1]), sys.argv[2]
    with mp.Manager() as manager:
        out = manager.dict()
        # Forked from this process, which has imported torch already (and run nothing in
        # it), rather than spawned: a spawned rank imports torch again, seconds of CPU
        # each, and the numbers are the same.
        mp.start_processes(run, args=(world, case, free_port(), out), nprocs=world,
                           start_method="fork")
        ranks = [out[r] for r in range(world)]
    json.dump({"torch": torch.__version__, "ranks": ranks}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
