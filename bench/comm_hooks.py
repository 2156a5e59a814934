#!/usr/bin/python3
"""Benchmark: communication hooks, libddp against PyTorch's DDP with the same hook.

    /usr/bin/python3 bench/comm_hooks.py [--repeats 3] [--steps 300]
                                        [--out bench/results/comm_hooks.json]

bench/jobs/mlp85k.yaml's model (64-256-256-10 MLP, 85,002 parameters, Adam, batch 32 per
rank, one intra-op thread), 2 ranks on this machine, with no hook, fp16_compress_hook and
powerSGD_hook (rank 1 after 10 plain iterations): libddp (build/bin/ddp-bench-comm-hooks)
and PyTorch 1.13's Python DDP (bench/comm_hooks_pytorch.py, Debian's torch, Gloo). Per
side and hook: the median step time of rank 0 (after 10 warm-up steps; the median over
--repeats runs) and the bytes each rank all-reduced per step (libddp's
BackwardStats::allreduce_bytes; PyTorch: what the hook passed to dist.all_reduce, and
for no hook the gradients' size).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
WORLD = 2
PARAMS = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv):
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                   LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        env.pop("DDP_EVENTS_FD", None)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"{argv} failed ({p.returncode}):\n{err.decode()[-2000:]}")
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return outs[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "comm_hooks.json"))
    a = ap.parse_args()
    result = {"world": WORLD, "params": PARAMS, "steps": a.steps, "hooks": {}}
    for hook in ("none", "fp16", "powersgd"):
        runs = {"libddp": [], "pytorch": []}
        for r in range(a.repeats):
            sides = ["libddp", "pytorch"] if r % 2 == 0 else ["pytorch", "libddp"]
            for side in sides:
                argv = ([os.path.join(BIN, "ddp-bench-comm-hooks"), hook, str(a.steps)]
                        if side == "libddp" else
                        ["/usr/bin/python3", os.path.join(ROOT, "bench", "comm_hooks_pytorch.py"),
                         hook, str(a.steps)])
                runs[side].append(run_ranks(argv))
        entry = {}
        for side, rs in runs.items():
            entry[side] = {"step_ms": statistics.median(x["step_ms"] for x in rs),
                           "bytes": rs[-1]["bytes"] or (PARAMS * 4 if hook == "none" else 0)}
        result["hooks"][hook] = entry
        print(hook, json.dumps(entry), flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
