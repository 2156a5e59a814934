#!/usr/bin/python3
"""ddp-trainer's benchmark suite: one command, every figure of docs/benchmarks.md.

    /usr/bin/python3 bench/suite.py [--repeats 5] [--out bench/results/suite.json] [--quick]

Needs the build (build/bin/ddp-trainer, ddp-bench-plain-loop, ddp-bench-allreduce) and
Debian's python3-torch. Every configuration runs once per repeat, interleaved with the
others, so that each comparison is taken side by side under the same machine load;
figures are medians over the repeats. Both sides run one intra-op thread per rank
(OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1, train.threads: 1).

  1. ddp-trainer (intra_node_comm shm and gloo) vs PyTorch DDP (gloo, batches gathered
     with index_select as ddp-trainer does, so the DDP engines are compared), 2 ranks:
     seconds per epoch of the training loop (setup and validation excluded), from the
     slowest rank's per-step time times the steps of an epoch.
  2. Scaling: per-rank step time with 2 ranks over that with 1 rank, same job.
  3. DDP overhead at world 1: ddp-trainer vs the same loop in plain LibTorch.
  4. All-reduce latency and bandwidth between 2 ranks, shared memory vs Gloo.
  5. Peak RSS per rank (ru_maxrss), ddp-trainer vs a PyTorch DDP rank.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import yaml

from benchkit import free_port  # noqa: E402  (bench/benchkit.py: the tests' ports)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
JOBS = os.path.join(ROOT, "bench", "jobs")
REFERENCE = os.path.join(ROOT, "scripts", "pytorch_ddp_reference.py")

# job -> steps per rank the suite trains (None: the job's own epochs). Long jobs are
# capped: their per-step time is steady after a few steps.
CAPS = {"cancer_mlp": None, "mlp85k": None, "wide_mlp": 40, "fmnist_cnn": 300}
QUICK_CAPS = {"cancer_mlp": 100, "mlp85k": 100, "wide_mlp": 10, "fmnist_cnn": 50}
SCALING_JOBS = ("cancer_mlp", "mlp85k")


def job_copy(tmp, job, cap, **train):
    """The job file with train.max_steps and `train` fields set (relative paths still
    resolve against bench/jobs, the trainers' working directory)."""
    with open(os.path.join(JOBS, job + ".yaml")) as f:
        spec = yaml.safe_load(f)
    spec["train"].update(train)
    if cap:
        spec["train"]["max_steps"] = cap
    path = os.path.join(tmp, f"{job}-{'-'.join(f'{k}{v}' for k, v in train.items())}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    return path


def steps_per_epoch(job, world):
    """Optimizer steps per epoch and rank, from a world-`world` ddp-trainer start event."""
    return STEPS_PER_EPOCH[(job, world)]


STEPS_PER_EPOCH = {}


def run_trainer(job, spec, world):
    """Runs `world` ranks of ddp-trainer; returns the slowest rank's seconds per step
    and every rank's peak RSS (KiB)."""
    port = free_port()
    procs = []
    for rank in range(world):
        out = tempfile.TemporaryFile()
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        p = subprocess.Popen([os.path.join(BIN, "ddp-trainer"), "--spec", spec], env=env,
                             cwd=JOBS, stdout=out, stderr=subprocess.DEVNULL)
        procs.append((p, out))
    step_s, rss, comm = [], [], None
    for p, out in procs:
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            sys.exit(f"ddp-trainer failed on {spec} (exit {p.returncode})")
        out.seek(0)
        events = [json.loads(l) for l in out.read().decode().splitlines() if l.startswith("{")]
        done = [e for e in events if e["type"] == "done"][-1]
        start = [e for e in events if e["type"] == "start"][0]
        STEPS_PER_EPOCH[(job, world)] = start["steps_per_epoch"]
        comm = start["intra_node_comm"]
        step_s.append(done["train_s"] / done["global_step"])
        rss.append(usage.ru_maxrss)
    return {"step_s": max(step_s), "rss_kb": max(rss), "intra_node_comm": comm}


def run_pytorch(job, world, cap):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, REFERENCE, "--spec", os.path.join(JOBS, job + ".yaml"),
               "--world", str(world), "--out", out.name, "--threads", "1", "--index-loader"]
        if cap:
            cmd += ["--max-steps", str(cap)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        ranks = json.load(open(out.name))["ranks"].values()
    return {"step_s": max(r["train_s"] / len(r["losses"]) for r in ranks),
            "rss_kb": max(r["max_rss_kb"] for r in ranks)}


def run_plain(spec):
    out = subprocess.run([os.path.join(BIN, "ddp-bench-plain-loop"), "--spec", spec], cwd=JOBS,
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"step_s": r["train_s"] / r["steps"]}


def run_allreduce(mode, world=2):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([os.path.join(BIN, "ddp-bench-allreduce"), "--intra-node",
                                       mode], env=env, stdout=subprocess.PIPE))
    outs = [p.communicate()[0].decode() for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit(f"ddp-bench-allreduce --intra-node {mode} failed")
    return {r["bytes"]: r["median_us"] for r in map(json.loads, outs[0].split())}


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="1 repeat, short runs: checks the suite")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "suite.json"))
    p.add_argument("--note", default="", help="recorded with the results (e.g. machine load)")
    args = p.parse_args()
    caps = QUICK_CAPS if args.quick else CAPS
    repeats = 1 if args.quick else args.repeats
    runs = {}  # (item, job, config) -> [result per repeat]

    def record(key, result):
        runs.setdefault(key, []).append(result)

    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            print(f"repeat {rep + 1}/{repeats}", flush=True)
            for job, cap in caps.items():
                for mode in ("shm", "gloo"):
                    record(("world2", job, mode),
                           run_trainer(job, job_copy(tmp, job, cap, intra_node_comm=mode), 2))
                record(("world2", job, "pytorch"), run_pytorch(job, 2, cap))
                record(("world1", job, "ddp-trainer"), run_trainer(job, job_copy(tmp, job, cap), 1))
                record(("world1", job, "plain"), run_plain(job_copy(tmp, job, cap)))
                if job in SCALING_JOBS:
                    record(("world1", job, "pytorch"), run_pytorch(job, 1, cap))
            for mode in ("shm", "gloo"):
                record(("allreduce", "", mode), run_allreduce(mode))

    jobs = {}
    for job in caps:
        w2 = {c: median(runs[("world2", job, c)], "step_s") for c in ("shm", "gloo", "pytorch")}
        w1 = {c: median(runs[("world1", job, c)], "step_s")
              for c in ("ddp-trainer", "plain", "pytorch") if ("world1", job, c) in runs}
        spe = steps_per_epoch(job, 2)
        jobs[job] = {
            "steps_per_epoch_world2": spe,
            "epoch_s": {c: w2[c] * spe for c in w2},
            "speedup_vs_pytorch": {c: w2["pytorch"] / w2[c] for c in ("shm", "gloo")},
            "step_ms_world2": {c: w2[c] * 1e3 for c in w2},
            "step_ms_world1": {c: w1[c] * 1e3 for c in w1},
            "scaling_world2_over_world1": (
                {"shm": w2["shm"] / w1["ddp-trainer"], "gloo": w2["gloo"] / w1["ddp-trainer"],
                 "pytorch": w2["pytorch"] / w1["pytorch"]} if "pytorch" in w1 else None),
            "overhead_world1": w1["ddp-trainer"] / w1["plain"] - 1,
            "peak_rss_mib": {c: median(runs[("world2", job, c)], "rss_kb") / 1024
                             for c in ("shm", "gloo", "pytorch")},
        }
    sizes = sorted(runs[("allreduce", "", "shm")][0])
    allreduce = {str(b): {m: statistics.median(r[b] for r in runs[("allreduce", "", m)])
                          for m in ("shm", "gloo")} for b in sizes}
    import torch
    result = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "kernel": platform.release(), "note": args.note},
        "torch": torch.__version__, "repeats": repeats, "quick": args.quick,
        "caps_steps_per_rank": caps, "jobs": jobs, "allreduce_median_us": allreduce,
        "runs": {"|".join(k): v for k, v in runs.items()},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)

    print("\n1. seconds per epoch, 2 ranks (speed-up over PyTorch DDP)")
    print("| job | ddp-trainer shm | ddp-trainer gloo | PyTorch DDP |\n|---|---:|---:|---:|")
    for job, j in jobs.items():
        e, s = j["epoch_s"], j["speedup_vs_pytorch"]
        print(f"| {job} | {e['shm']:.3f} ({s['shm']:.2f}x) | {e['gloo']:.3f} ({s['gloo']:.2f}x) "
              f"| {e['pytorch']:.3f} |")
    print("\n2. per-rank step time, 2 ranks / 1 rank")
    print("| job | 1 rank ms | shm | gloo | PyTorch DDP |\n|---|---:|---:|---:|---:|")
    for job, j in jobs.items():
        if j["scaling_world2_over_world1"]:
            s = j["scaling_world2_over_world1"]
            print(f"| {job} | {j['step_ms_world1']['ddp-trainer']:.3f} | {s['shm']:.2f} | "
                  f"{s['gloo']:.2f} | {s['pytorch']:.2f} |")
    print("\n3. DDP overhead at world 1 (ddp-trainer vs plain LibTorch loop)")
    print("| job | plain ms/step | ddp-trainer ms/step | overhead |\n|---|---:|---:|---:|")
    for job, j in jobs.items():
        w1 = j["step_ms_world1"]
        print(f"| {job} | {w1['plain']:.3f} | {w1['ddp-trainer']:.3f} | "
              f"{j['overhead_world1'] * 100:+.1f}% |")
    print("\n4. all-reduce, 2 ranks: median µs (GB/s)")
    print("| size | shm | gloo |\n|---:|---:|---:|")
    for b, m in allreduce.items():
        b = int(b)
        print(f"| {b / 1024:.0f} KiB | {m['shm']:.1f} ({b / m['shm'] / 1e3:.2f}) | "
              f"{m['gloo']:.1f} ({b / m['gloo'] / 1e3:.2f}) |")
    print("\n5. peak RSS per rank, MiB (2 ranks)")
    print("| job | ddp-trainer shm | ddp-trainer gloo | PyTorch DDP |\n|---|---:|---:|---:|")
    for job, j in jobs.items():
        r = j["peak_rss_mib"]
        print(f"| {job} | {r['shm']:.0f} | {r['gloo']:.0f} | {r['pytorch']:.0f} |")


if __name__ == "__main__":
    main()
