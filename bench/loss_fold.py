#!/usr/bin/env python3
"""What the live-recovery loss fold costs (decision 186), side by side in one run.

bench/jobs/mlp85k.yaml (64-256-256-10 MLP, batch 32, Adam, 2 ranks: the step is short and
overhead-bound, so a per-step cost shows) on one loopback cluster of two workers
(ddp-coordinator and ddp-worker with default settings, the real ddp-trainer, one rank a
worker, the ranks summing through shared memory). Each repeat submits it twice, in
alternating order:

  off   max_recoveries: 0  (each rank keeps its own loss total; no fold)
  fold  max_recoveries: 1  (each step's [loss, 1] is summed over the ranks beside its
                            gradients)

Measured from the coordinator's record (`ddpctl get -o json --history`): the job's
samples/s, the sum over its ranks of each rank's median `samples_per_s` over its step
windows (100 steps each; the first window of each epoch left out: it holds the epoch's
start and the previous epoch's validation). The figures are the medians over --repeats
of each side and of the per-repeat fold/off ratio.

Usage: python3 bench/loss_fold.py [--repeats N]  (results: bench/results/loss_fold.json)
"""
import argparse
import json
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import cluster  # noqa: E402
from recovery import HERE, wait  # noqa: E402

with open(os.path.join(HERE, "bench", "jobs", "mlp85k.yaml")) as f:
    BASE = f.read()


def job_text(mode):
    return (BASE.replace("name: bench-mlp85k", f"name: fold-{mode}") +
            f"nodes: 2\nmax_recoveries: {1 if mode == 'fold' else 0}\n")


def samples_per_s(job):
    by_rank = {}
    for m in job.get("history", []):
        if int(m.get("step", 0)) < 100:  # The epoch's first window.
            continue
        by_rank.setdefault(int(m.get("rank", 0)), []).append(float(m["samples_per_s"]))
    return sum(statistics.median(v) for v in by_rank.values())


def run(c, mode):
    spec = os.path.join(c.dir, f"{mode}.yaml")
    with open(spec, "w") as f:
        f.write(job_text(mode))
    job_id = c.ctl("submit", spec).strip()
    wait(lambda: c.job(job_id)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
         timeout=600, every=1.0)  # Seldom: each look runs a ddpctl.
    j = c.job(job_id, history=True)
    if j["state"] != "SUCCEEDED":
        raise SystemExit(f"{mode}: {j['state']}: {j.get('reason')}")
    return samples_per_s(j)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "bench", "results", "loss_fold.json"))
    a = ap.parse_args()
    c = cluster(2)
    tp = {"off": [], "fold": []}
    try:
        c.wait_for_workers()
        for r in range(a.repeats):
            for mode in (("off", "fold") if r % 2 == 0 else ("fold", "off")):
                tp[mode].append(run(c, mode))
            print(f"repeat {r + 1}: off {tp['off'][-1]:,.0f}; fold {tp['fold'][-1]:,.0f} "
                  "samples/s", flush=True)
    finally:
        c.stop()
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "job": "bench/jobs/mlp85k.yaml, nodes: 2", "repeats": a.repeats,
        "samples_per_s": {k: [round(x) for x in v] for k, v in tp.items()},
        "samples_per_s_median": {k: round(statistics.median(v)) for k, v in tp.items()},
        # fold over off, minus 1 (median of the per-repeat ratios).
        "fold_over_off_pct": round(statistics.median(
            100.0 * (f / o - 1.0) for f, o in zip(tp["fold"], tp["off"])), 2),
    }
    print(json.dumps(result, indent=1))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
