"""PyTorch's own ZeroRedundancyOptimizer on zero_program.cc's setup.

    python tests/libddp/zero_reference.py WORLD OPTIMIZER[,OPTIMIZER...] > reference.json

An MLP (Linear 10->32, ReLU, Linear 32->16, ReLU, Linear 16->3) with deterministic
parameters (sin(0.37 k + i) * 0.3 for parameter i) trains under
DistributedDataParallel (Gloo, CPU) on WORLD ranks with
torch.distributed.optim.ZeroRedundancyOptimizer (parameters_as_bucket_view=False) over
two param groups (the body with the defaults, the head with its own learning rate),
each OPTIMIZER (one process group, one after the other) one of sgd (momentum 0.9), adam, adamw, rmsprop (momentum 0.5), adagrad. Rank
r's batch in step s is rows (s*WORLD + r)*8 .. +8 (mod 96) of seeded random data.
After STEPS steps the state is consolidated on rank 0 (consolidate_state_dict(0),
state_dict()); then MORE steps. Prints {"torch": version, OPTIMIZER: {"ranks": [per rank
{"losses", "params", "partition"}], "state": rank 0's consolidated state {index: {name:
values}}, "param_groups": its param groups' params}, ...}.
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
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

N, FEATURES, CLASSES, BATCH = 96, 10, 3, 8
STEPS, MORE = 5, 4
LR, HEAD_LR = 0.01, 0.02

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": LR, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": LR}),
    "adamw": (torch.optim.AdamW, {"lr": LR}),
    "rmsprop": (torch.optim.RMSprop, {"lr": LR, "momentum": 0.5}),
    "adagrad": (torch.optim.Adagrad, {"lr": LR}),
}


def make_net():
    net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                        nn.Linear(16, CLASSES))
    with torch.no_grad():
        for i, p in enumerate(net.parameters()):
            v = torch.sin(torch.arange(p.numel(), dtype=torch.float32) * 0.37 + i) * 0.3
            p.copy_(v.view(p.shape))
    return net


def run(rank, world, port, names, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for name in names:
        out[(name, rank)] = train(rank, world, name)
    dist.destroy_process_group()


def train(rank, world, name):
    torch.manual_seed(1)
    x_all = torch.randn(N, FEATURES)
    y_all = torch.randint(0, CLASSES, (N,))
    model = DDP(make_net())
    params = list(model.module.parameters())
    cls, defaults = OPTIMIZERS[name]
    head = {"params": params[-2:], "lr": HEAD_LR}
    opt = ZeroRedundancyOptimizer([{"params": params[:-2]}, head], optimizer_class=cls,
                                  parameters_as_bucket_view=False, **defaults)
    index = {p: i for i, p in enumerate(params)}
    partition = [[index[p] for g in groups for p in g["params"]]
                 for groups in opt._partition_parameters()]
    losses, state, groups = [], None, None
    for step in range(STEPS + MORE):
        if step == STEPS:
            opt.consolidate_state_dict(0)
            if rank == 0:
                sd = opt.state_dict()
                state = {str(i): {k: torch.as_tensor(v).double().flatten().tolist()
                                  for k, v in s.items()} for i, s in sd["state"].items()}
                groups = [g["params"] for g in sd["param_groups"]]
        idx = (torch.arange(BATCH) + (step * world + rank) * BATCH) % N
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    result = {"losses": losses, "partition": partition,
              "params": [p.detach().double().flatten().tolist() for p in params]}
    if rank == 0:
        result["state"] = state
        result["param_groups"] = groups
    return result


def main():
    world, names = int(sys.argv[1]), sys.argv[2].split(",")
    torch.set_num_threads(1)
    port = claim_port()  # Of this process's own, claimed against tests run beside it.
    with mp.Manager() as manager:
        out = manager.dict()
        # Forked from this process, which has imported torch already (and run nothing in
        # it), rather than spawned: a spawned rank imports torch again, seconds of CPU
        # each, and the numbers are the same.
        mp.start_processes(run, args=(world, port, names, out), nprocs=world,
                           start_method="fork")
        result = {"torch": torch.__version__}
        for name in names:
            ranks = [out[(name, r)] for r in range(world)]
            result[name] = {"ranks": ranks, "state": ranks[0].pop("state"),
                            "param_groups": ranks[0].pop("param_groups")}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
