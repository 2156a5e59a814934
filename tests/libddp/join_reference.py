#!/usr/bin/python3
"""PyTorch's own Join([ddp_model]) and Join([ddp_model, zero_optim]) (uneven inputs) on
the setup of join_program.cc.

    python3 tests/libddp/join_reference.py WORLD > out.json

Net (Linear(4, 8), BatchNorm1d(8), ReLU, Linear(8, 3): parameters l1.weight, l1.bias,
bn.weight, bn.bias, l2.weight, l2.bias; buffers bn.running_mean, bn.running_var,
bn.num_batches_tracked) trains under DistributedDataParallel (Gloo, CPU) on WORLD
ranks, rank r on 5 + 2r batches, SGD with momentum, inside
Join([model], throw_on_early_termination=..., divide_by_initial_world_size=...).
Parameters and inputs come from closed formulas, no random generator. One run per mode
on one process group:
  divide     divide_by_initial_world_size=True (PyTorch's default)
  nodivide   divide_by_initial_world_size=False
  throw      throw_on_early_termination=True: every rank raises, rank 0 out of the
             Join's exit, the others from their next forward
  zero_sgd   ZeroRedundancyOptimizer over the same SGD, Join([model, optimizer]),
             zero_grad(set_to_none=False): a joined rank's ZeRO step sees zeros
  zero_adam  ZeroRedundancyOptimizer over Adam (ADAM_LR, ADAM_EPS), Join([model, optimizer]),
             zero_grad(set_to_none=True): a joined rank's ZeRO step sees no gradients
After the Join (divide and nodivide), every rank trains one more step outside it.
Prints {"torch": version, "ranks": [per rank: {mode: losses (per step this rank ran in
the Join), params and buffers (after the Join, flattened per tensor), error (the
exception's message, or None), after and params_after (that step's loss and the
parameters after it; not in throw), and in the zero modes on rank 0 state: the state
consolidated on rank 0 right after the Join (consolidate_state_dict(0), state_dict():
{index: {name: flattened values}})}]}.
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
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer

BATCH = 6
ADAM_LR = 0.01
# l1.bias feeds BatchNorm: its gradient is 0 but for rounding, which Adam's default eps
# (1e-8) would turn into steps of about ADAM_LR, of a sign that depends on the order
# the ranks' sums add in; this eps keeps such steps small.
ADAM_EPS = 1e-3
MODES = ("divide", "nodivide", "throw", "zero_sgd", "zero_adam")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.l2 = nn.Linear(8, 3)
        with torch.no_grad():
            for k, p in enumerate(self.parameters()):
                p.copy_(formula_param(p.numel(), k).view(p.shape))

    def forward(self, x):
        return self.l2(torch.relu(self.bn(self.l1(x))))


def formula_param(numel, k):
    return (torch.sin(torch.arange(numel, dtype=torch.float64) * 0.37 + k) * 0.5).float()


def formula_batch(step, rank):
    i = torch.arange(BATCH * 4, dtype=torch.float64)
    x = torch.cos(i * 0.3 + step * 7 + rank * 13).float().view(BATCH, 4)
    j = torch.arange(BATCH * 3, dtype=torch.float64)
    y = torch.sin(j * 0.21 + step * 5 + rank * 3).float().view(BATCH, 3)
    return x, y


def train(rank, mode):
    net = Net()
    model = nn.parallel.DistributedDataParallel(net)
    if mode == "zero_sgd":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                      lr=0.1, momentum=0.9)
    elif mode == "zero_adam":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=ADAM_LR, eps=ADAM_EPS)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    joinables = [model, opt] if mode.startswith("zero") else [model]
    result = {"losses": [], "error": None}
    try:
        with Join(joinables, throw_on_early_termination=(mode == "throw"),
                  divide_by_initial_world_size=(mode != "nodivide")):
            for step in range(5 + 2 * rank):
                x, y = formula_batch(step, rank)
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                result["losses"].append(loss.item())
                opt.step()
                opt.zero_grad(set_to_none=(mode != "zero_sgd"))
    except RuntimeError as e:
        result["error"] = str(e)
    result["params"] = [p.detach().view(-1).tolist() for p in net.parameters()]
    result["buffers"] = [b.detach().double().view(-1).tolist() for b in net.buffers()]
    if mode.startswith("zero"):
        opt.consolidate_state_dict(0)
        if rank == 0:
            sd = opt.state_dict()
            result["state"] = {
                str(i): {k: torch.as_tensor(v).double().flatten().tolist()
                         for k, v in s.items()} for i, s in sd["state"].items()}
    if mode != "throw":
        # One even step on every rank after the Join: the gradients are divided by the
        # world size again whatever divide_by_initial_world_size was.
        x, y = formula_batch(100, rank)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        result["after"] = loss.item()
        opt.step()
        result["params_after"] = [p.detach().view(-1).tolist() for p in net.parameters()]
    return result


def run(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    out[rank] = {mode: train(rank, mode) for mode in MODES}
    dist.destroy_process_group()


def free_port():
    # A port of this process's own, claimed against tests run beside it (ctest -j).
    return claim_port()


def main():
    world = int(sys.argv[1])
    with mp.Manager() as manager:
        out = manager.dict()
        # Forked from this process, which has imported torch already (and run nothing in
        # it), rather than spawned: a spawned rank imports torch again, seconds of CPU
        # each, and the numbers are the same.
        mp.start_processes(run, args=(world, free_port(), out), nprocs=world,
                           start_method="fork")
        ranks = [out[r] for r in range(world)]
    json.dump({"torch": torch.__version__, "ranks": ranks}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
