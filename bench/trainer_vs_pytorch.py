#!/usr/bin/python3
"""Benchmark: ddp-trainer vs PyTorch's Python DDP, same job, threads and machine.

    /usr/bin/python3 bench/trainer_vs_pytorch.py [--repeats 3] [--out bench/results/x.json]

For each job in bench/jobs/, runs WORLD ranks of build/bin/ddp-trainer (Gloo) and
of scripts/pytorch_ddp_reference.py (torch.nn.parallel.DistributedDataParallel,
gloo, Debian's python3-torch) with the same intra-op thread count, and reports
training throughput: samples trained by all ranks / the slowest rank's time in the
training loop (setup, validation and checkpoints excluded on both sides), with
OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1 and train.threads: 1 on both sides. The
Python side is timed twice: with the standard DataLoader (per-sample collate) and
with batches gathered by index_select (ddp-trainer's data path), so the pure DDP
engine is compared too. Median of --repeats runs.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from benchkit import free_port  # noqa: E402  (bench/benchkit.py: the tests' ports)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, "build", "bin", "ddp-trainer")
REFERENCE = os.path.join(ROOT, "scripts", "pytorch_ddp_reference.py")


# glibc's allocator returns freed memory to the kernel and faults it back in on every
# step for some allocation patterns (seen with PyTorch on Fashion-MNIST); these
# settings keep it, for both sides alike.
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000",
                "MALLOC_TOP_PAD_": "100000000"}


def run_ddp_trainer(spec, world):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([TRAINER, "--spec", spec], env=env, cwd=os.path.dirname(spec),
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    samples, times = 0, []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"ddp-trainer failed on {spec}")
        done = [json.loads(l) for l in out.decode().splitlines() if '"type":"done"' in l][-1]
        samples += done["samples"]
        times.append(done["train_s"])
    return samples / max(times)


def run_pytorch(spec, world, index_loader):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, REFERENCE, "--spec", spec, "--world", str(world), "--out", out.name]
        if index_loader:
            cmd.append("--index-loader")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        ranks = json.load(open(out.name))["ranks"].values()
    return sum(r["samples"] for r in ranks) / max(r["train_s"] for r in ranks)


def main():
    # Both sides get the same thread environment: one OpenMP and one OpenBLAS thread
    # per rank (torchrun's own default for several ranks per node), so neither side's
    # ranks fight over the cores with spinning BLAS threads.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "trainer_vs_pytorch.json"))
    p.add_argument("--tuned-malloc", action="store_true",
                   help="run both sides with glibc malloc's trim/mmap thresholds raised")
    args = p.parse_args()
    if args.tuned_malloc:
        os.environ.update(TUNED_MALLOC)
    jobs_dir = os.path.join(ROOT, "bench", "jobs")
    rows = []
    for name in sorted(os.listdir(jobs_dir)):
        if not name.endswith(".yaml"):
            continue
        spec = os.path.join(jobs_dir, name)
        ours, loader, indexed = [], [], []
        for _ in range(args.repeats):
            ours.append(run_ddp_trainer(spec, args.world))
            loader.append(run_pytorch(spec, args.world, False))
            indexed.append(run_pytorch(spec, args.world, True))
        row = {"job": name[:-5], "ddp_trainer": statistics.median(ours),
               "pytorch_dataloader": statistics.median(loader),
               "pytorch_index_select": statistics.median(indexed),
               "runs": {"ddp_trainer": ours, "pytorch_dataloader": loader,
                        "pytorch_index_select": indexed}}
        rows.append(row)
        print(f"{row['job']:<14} ddp-trainer {row['ddp_trainer']:>10.0f}  "
              f"pytorch+DataLoader {row['pytorch_dataloader']:>10.0f}  "
              f"pytorch+index_select {row['pytorch_index_select']:>10.0f}  samples/s", flush=True)
    import torch
    env_vars = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") + tuple(TUNED_MALLOC)
    result = {"env": {v: os.environ[v] for v in env_vars if v in os.environ},
              "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or
                          platform.machine(), "kernel": platform.release()},
              "torch": torch.__version__, "world": args.world, "repeats": args.repeats,
              "jobs": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n| job | ddp-trainer | PyTorch DDP + DataLoader | PyTorch DDP + index_select |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['job']} | {r['ddp_trainer']:.0f} | {r['pytorch_dataloader']:.0f} "
              f"({r['ddp_trainer'] / r['pytorch_dataloader']:.2f}x) | "
              f"{r['pytorch_index_select']:.0f} ({r['ddp_trainer'] / r['pytorch_index_select']:.2f}x) |")


if __name__ == "__main__":
    main()
