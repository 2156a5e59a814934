#!/usr/bin/env python3
"""What a checkpoint costs the training loop, synchronous against asynchronous (decision 192).

A 256-2048-2048-2048-10 MLP (8,939,530 parameters: 35.8 MB of float32, with Adam's two
moments 107 MB of state per checkpoint), batch 32, one rank of the real ddp-trainer
(one intra-op thread), synthetic data, `train.max_steps` steps. Each repeat runs,
in rotating order:

  none   no checkpoint.dir: the steps alone
  sync   checkpoint.async: false, every --every steps: training waits for each save
  async  checkpoint.async: true (the default), the same saves: training waits for the
         state's copy into host memory (and a save still in flight) only

Measured from the trainer's own events: the run's wall time from its first to its last
step event (every step reports), the median step_ms (a step's own time: the
saves happen between steps),
what each save held the loop up (sync: the checkpoint event's write_ms; async: its
snapshot_ms + wait_ms), the background write's duration (async write_ms), and the
process's peak RSS (ru_maxrss). The figures are medians over --repeats.

Usage: python3 bench/async_checkpoint.py [--repeats 3] [--steps 120] [--every 20]
       [--bin build/bin] [--out bench/results/async_checkpoint.json]
"""
import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = """name: bench-async-checkpoint
model: {{mlp: {{hidden: [2048, 2048, 2048]}}}}
data: {{synthetic: {{samples: 8192, features: 256, classes: 10}}}}
train: {{epochs: 100, batch_size: 32, threads: 1, max_steps: {steps},
        optimizer: {{name: adam, lr: 0.0001}}}}
metrics: {{every_steps: 1}}
{checkpoint}
"""


def run(mode, args, work):
    ckpt = ""
    if mode != "none":
        ckpt = (f"checkpoint: {{dir: {work}/ckpt-{mode}, every_steps: {args.every}, "
                f"keep: 2, resume: false, async: {'true' if mode == 'async' else 'false'}}}")
    spec = os.path.join(work, f"{mode}.yaml")
    with open(spec, "w") as f:
        f.write(JOB.format(steps=args.steps, checkpoint=ckpt))
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    env.pop("DDP_EVENTS_FD", None)
    # A child of its own per run, so that ru_maxrss is this run's.
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE,"
             " text=True)\n"
             "sys.stdout.write(p.stdout)\n"
             "sys.stderr.write(p.stderr[-4000:])\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
             "sys.exit(p.returncode)\n")
    p = subprocess.run([sys.executable, "-c", probe, os.path.join(args.bin, "ddp-trainer"),
                        "--spec", spec], env=env, cwd=work, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"{mode}: ddp-trainer failed ({p.returncode}):\n{p.stderr}")
    peak_kib = int(p.stderr.strip().splitlines()[-1])
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    steps = [e for e in events if e["type"] == "step"]
    saves = [e for e in events if e["type"] == "checkpoint"]
    start = next(e for e in events if e["type"] == "start")
    if mode == "sync":
        held = [e["write_ms"] for e in saves]
    elif mode == "async":
        held = [e["snapshot_ms"] + e["wait_ms"] for e in saves]
    else:
        held = []
    return {
        "wall_s": steps[-1]["time"] - steps[0]["time"],
        "params": start["params"],
        "median_step_ms": statistics.median(e["step_ms"] for e in steps),
        "saves": len(saves),
        "held_ms_per_save": statistics.median(held) if held else 0.0,
        "write_ms_per_save": statistics.median([e["write_ms"] for e in saves]) if saves else 0.0,
        "peak_rss_mib": peak_kib / 1024.0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "async_checkpoint.json"))
    args = ap.parse_args()
    modes = ["none", "sync", "async"]
    runs = {m: [] for m in modes}
    work = tempfile.mkdtemp(prefix="ddp-bench-async-ckpt-")
    try:
        for i in range(args.repeats):
            order = modes[i % 3:] + modes[:i % 3]
            for m in order:
                runs[m].append(run(m, args, work))
                shutil.rmtree(os.path.join(work, f"ckpt-{m}"), ignore_errors=True)
                print(m, runs[m][-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for m in modes:
        summary[m] = {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]}
    sync_held = summary["sync"]["held_ms_per_save"]
    summary["async_held_share_of_sync"] = (summary["async"]["held_ms_per_save"] / sync_held
                                           if sync_held else None)
    print(f"\n{'':6} {'wall s':>8} {'step ms':>8} {'saves':>6} {'held ms/save':>13} "
          f"{'write ms':>9} {'peak RSS MiB':>13}")
    for m in modes:
        s = summary[m]
        print(f"{m:6} {s['wall_s']:8.2f} {s['median_step_ms']:8.2f} {s['saves']:6.0f} "
              f"{s['held_ms_per_save']:13.1f} {s['write_ms_per_save']:9.1f} "
              f"{s['peak_rss_mib']:13.0f}")
    print(f"async holds the loop {100 * summary['async_held_share_of_sync']:.1f} % of a sync save")
    result = {"command": "python3 bench/async_checkpoint.py " + " ".join(sys.argv[1:]),
              "machine": f"{platform.node()} {os.cpu_count()} cores",
              "steps": args.steps, "every": args.every, "repeats": args.repeats,
              "summary": summary, "runs": runs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
