"""PyTorch's own DDP with a communication hook on comm_hook_program.cc's setup.

    python tests/libddp/comm_hook_reference.py CONFIG_JSON > reference.json

CONFIG_JSON: {"name": {"hook": "none|fp16|bf16|powersgd", "rank": 1, "start": 2,
"error_feedback": 1, "warm_start": 1, "batch": 0}, ...}. For each config and for 2 and 3
ranks, a small BatchNorm MLP with a frozen parameter trains on seeded random data under
DistributedDataParallel (Gloo, CPU) with the hook registered (register_comm_hook:
default_hooks.fp16_compress_hook / bf16_compress_hook, powerSGD_hook.PowerSGDState +
powerSGD_hook), gradient accumulation through no_sync() and SGD with momentum. Each rank
records its per-step loss and the bytes of the tensors the hook passed to
torch.distributed.all_reduce in that step. Prints {"torch": version, "NAME/world_W":
[per rank {"losses", "bytes"}] or {"unsupported": why}}.

A config with "stop_after": E and "state": PREFIX ends after epoch E, each rank saving
{"epoch", "model", "optimizer", "powersgd"} with torch.save to
PREFIX.world<W>.rank<R>.pt (the PowerSGDState pickled, as PyTorch checkpoints it); one
with "resume": PREFIX loads that and goes on from epoch E + 1 (the unpickled state
joins the default process group).
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.utils.data import DistributedSampler

BATCH, ACCUM, EPOCHS = 6, 2, 8
LR, MOMENTUM = 0.1, 0.9


def run(rank, world, port, config, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sent = [0]
    all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):  # What the hook sends.
        sent[0] += tensor.numel() * tensor.element_size()
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    torch.set_num_threads(1)
    net, x_all, y_all = seeded_net_and_data()
    model = nn.parallel.DistributedDataParallel(net)
    hook = config["hook"]
    saved = None
    if "resume" in config:
        saved = torch.load(f"{config['resume']}.world{world}.rank{rank}.pt", weights_only=False) \
            if int(torch.__version__.split(".")[0]) >= 2 else \
            torch.load(f"{config['resume']}.world{world}.rank{rank}.pt")
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        state = saved["powersgd"] if saved else powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=config["rank"],
            start_powerSGD_iter=config["start"], use_error_feedback=bool(config["error_feedback"]),
            warm_start=bool(config["warm_start"]),
            batch_tensors_with_same_shape=bool(config["batch"]))
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    first_epoch = 0
    if saved:
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        first_epoch = saved["epoch"] + 1
    sampler = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=0)
    micro = (len(sampler) + BATCH - 1) // BATCH
    steps = (micro + ACCUM - 1) // ACCUM
    losses, sent_bytes = [], []
    for epoch in range(first_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        order = list(sampler)
        model.train()
        for step in range(steps):
            first = step * ACCUM
            n = min(ACCUM, micro - first)
            total_loss = 0.0
            sent[0] = 0
            for j in range(n):
                idx = order[(first + j) * BATCH:(first + j + 1) * BATCH]
                ctx = model.no_sync() if j < n - 1 else nullcontext()
                with ctx:
                    loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
                    (loss / n).backward()
                total_loss += loss.item()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total_loss / n)
            sent_bytes.append(sent[0])
        if epoch == config.get("stop_after", -1):
            torch.save({"epoch": epoch, "model": net.state_dict(), "optimizer": opt.state_dict(),
                        "powersgd": state},
                       f"{config['state']}.world{world}.rank{rank}.pt")
            break
    out[rank] = {"losses": losses, "bytes": sent_bytes}
    # Not dist.destroy_process_group() and a return. PowerSGD's hook keeps the process group
    # in the closures it chains on each all-reduce's future, and Gloo's worker thread frees
    # those closures after it has completed the future: when this rank's own references
    # (the model's reducer, the state) go first, the group's last one goes on that thread,
    # and ProcessGroupGloo's destructor joins its own thread ("terminate called after
    # throwing an instance of 'std::system_error': Resource deadlock avoided", a rank
    # aborted once in CI under torch 1.13). The barrier puts every rank past its last
    # collective; the rank then ends at once, without destructors (its result is in the
    # manager already).
    dist.barrier()
    os._exit(0)


def free_port():
    # A port of this process's own, claimed against tests run beside it (ctest -j).
    return claim_port()


def main():
    configs = json.loads(sys.argv[1])
    result = {"torch": torch.__version__}
    # Gloo sums bfloat16 from PyTorch 2.x on only.
    bf16 = int(torch.__version__.split(".")[0]) >= 2
    for name, config in configs.items():
        for world in (2, 3):
            key = f"{name}/world_{world}"
            if config["hook"] == "bf16" and not bf16:
                result[key] = {"unsupported": f"Gloo in torch {torch.__version__} has no bfloat16"}
                continue
            with mp.Manager() as manager:
                out = manager.dict()
                # Forked from this process, which has imported torch already (and run nothing in
                # it), rather than spawned: a spawned rank imports torch again, seconds of CPU
                # each, and the numbers are the same.
                mp.start_processes(run, args=(world, free_port(), config, out), nprocs=world,
                                   start_method="fork")
                result[key] = [out[r] for r in range(world)]
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
