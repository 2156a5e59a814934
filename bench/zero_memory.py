#!/usr/bin/python3
"""Benchmark: optimizer state per rank, ZeRO stage 1 against plain DDP.

    /usr/bin/python3 bench/zero_memory.py [--worlds 1,2,3] [--steps 20] [--bin build/bin]
                                          [--out bench/results/zero_memory.json]

A 784-1024-512-10 MLP (1,333,770 parameters, 5.3 MB of float32) with Adam under DDP,
batch 32 per rank, one intra-op thread, ranks on this machine. For each world size:
libddp with the plain torch::optim::Adam on every rank and with
ddp::ZeroRedundancyOptimizer (build/bin/ddp-bench-zero-memory), and PyTorch's
torch.distributed.optim.ZeroRedundancyOptimizer on the same model (this Python's torch,
Gloo). Per rank: the bytes of the optimizer state's tensors (Adam's exp_avg and
exp_avg_sq; PyTorch also keeps `step` as a 4-byte tensor per parameter, counted), the
parameters the rank owns, the peak RSS, and libddp's median step time.
"""
import argparse
import json
import os
import subprocess
import sys

from benchkit import free_port  # noqa: E402  (bench/benchkit.py: the tests' ports)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")


def run_ranks(world, argv):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        env.pop("DDP_EVENTS_FD", None)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            sys.exit(f"{argv[0]} failed with {p.returncode}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def pytorch_zero(rank, world, port, steps, out):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                              nn.Linear(512, 10)))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    torch.manual_seed(1 + rank)
    for _ in range(steps):
        F.cross_entropy(model(torch.randn(32, 784)), torch.randint(0, 10, (32,))).backward()
        opt.step()
        opt.zero_grad()
    state = sum(t.numel() * t.element_size() for s in opt.optim.state.values()
                for t in s.values() if torch.is_tensor(t))
    owned = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
    out[rank] = {"rank": rank, "state_bytes": state, "owned_params": owned}
    dist.destroy_process_group()


def run_pytorch(world, steps):
    import torch.multiprocessing as mp
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(pytorch_zero, args=(world, free_port(), steps, out), nprocs=world)
        return [out[r] for r in range(world)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bin", default=BIN, help="where ddp-bench-zero-memory is")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "zero_memory.json"))
    args = ap.parse_args()
    program = os.path.join(args.bin, "ddp-bench-zero-memory")
    results = []
    print(f"{'world':>5} {'side':>14} {'rank':>4} {'state bytes':>12} {'owned params':>12} "
          f"{'peak RSS MB':>11} {'step ms':>8}")
    for world in [int(w) for w in args.worlds.split(",")]:
        for side in ("plain", "zero"):
            for r in run_ranks(world, [program, "--optimizer", side, "--steps", str(args.steps)]):
                r["side"] = f"libddp {side}"
                results.append(dict(r, world=world))
        for r in run_pytorch(world, args.steps):
            r["side"] = "pytorch zero"
            results.append(dict(r, world=world))
        for r in results:
            if r["world"] != world:
                continue
            rss = f"{r['max_rss_kb'] / 1024:.0f}" if "max_rss_kb" in r else "-"
            ms = f"{r['step_ms']:.2f}" if "step_ms" in r else "-"
            print(f"{world:>5} {r['side']:>14} {r['rank']:>4} {r['state_bytes']:>12,} "
                  f"{r['owned_params']:>12,} {rss:>11} {ms:>8}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
