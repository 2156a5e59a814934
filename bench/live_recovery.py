#!/usr/bin/env python3
"""Live recovery against a restart from the checkpoint, side by side (issue 29).

The same job twice per repeat, interleaved, each on a fresh loopback cluster of three
workers (ddp-coordinator and ddp-worker with default settings, the real ddp-trainer on
Gloo, one rank per worker): an MLP 128x128 on 20,000 synthetic samples, a step metric
every step, a checkpoint every 200 steps. Rank 1's trainer is killed with SIGKILL once
every rank has passed step 260 (60-odd steps after the last checkpoint).

  live     max_recoveries: 1  (the two survivors keep their processes; a replacement
                               takes their state)
  restart  max_restarts: 1    (today's path: a new attempt resumes from the checkpoint)

Measured from the coordinator's record (`ddpctl get -o json --history`):
  first step   the first step metric of the replaced rank (live) or of the new
               attempt (restart), as the coordinator received it, minus the kill's time
  steps lost   steps completed before the kill that were trained again after it:
               the highest step reported before the kill + 1, minus the step the
               training went on from

Usage: python3 bench/live_recovery.py [--repeats N]  (results: bench/results/live_recovery.json)
"""
import argparse
import json
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import cluster  # noqa: E402
from recovery import HERE, wait  # noqa: E402

JOB = """name: {name}
nodes: 3
max_restarts: {restarts}
max_recoveries: {recoveries}
model: {{mlp: {{hidden: [128, 128]}}}}
data: {{synthetic: {{samples: 20000, features: 64, classes: 10}}}}
train: {{epochs: 3, batch_size: 32, threads: 1}}
metrics: {{every_steps: 1}}
checkpoint: {{dir: "ckpt-{{node}}", every_steps: 200}}
"""
KILL_AFTER = 260


def run(mode):
    c = cluster(3)
    try:
        c.wait_for_workers()
        spec = os.path.join(c.dir, "job.yaml")
        with open(spec, "w") as f:
            f.write(JOB.format(name=mode, restarts=1 if mode == "restart" else 0,
                               recoveries=1 if mode == "live" else 0))
        job_id = c.ctl("submit", spec).strip()

        def stepped():
            j = c.job(job_id)
            ms = j.get("metrics", [])
            return j if j.get("state") == "RUNNING" and len(ms) == 3 and \
                min(int(m.get("global_step", 0)) for m in ms) > KILL_AFTER else None
        j = wait(stepped, every=0.02)
        rank1 = next(r for r in j["attempts"][0]["ranks"] if r.get("rank", 0) == 1)
        t_fault = time.time()
        os.kill(int(rank1["pid"]), signal.SIGKILL)
        t_ms = t_fault * 1000

        def after():
            j = c.job(job_id, history=True)
            hist = j.get("history", [])
            if mode == "live":
                later = [m for m in hist if int(m.get("update_ms", 0)) > t_ms and
                         int(m.get("rank", 0)) == 1 and int(m.get("attempt", 0)) == 1]
            else:
                later = [m for m in hist if int(m.get("attempt", 0)) == 2]
            return (j, min(later, key=lambda m: int(m["update_ms"]))) if later else None
        j, first = wait(after, every=0.1)
        before = [int(m.get("global_step", 0)) for m in j.get("history", [])
                  if int(m.get("attempt", 0)) == 1 and int(m.get("update_ms", 0)) <= t_ms]
        wait(lambda: c.job(job_id)["state"] in ("SUCCEEDED", "FAILED"), timeout=600)
        end = c.job(job_id)
        return {"mode": mode,
                "first_step_s": round(int(first["update_ms"]) / 1000 - t_fault, 3),
                "steps_lost": max(before) + 1 - int(first.get("global_step", 0)),
                "outcome": end["state"],
                "attempts": len(end["attempts"]),
                "recoveries": int(end.get("recoveries", 0))}
    finally:
        c.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    runs = []
    for _ in range(args.repeats):
        for mode in ("live", "restart"):
            r = run(mode)
            print(json.dumps(r), flush=True)
            runs.append(r)
    summary = {}
    for mode in ("live", "restart"):
        rs = [r for r in runs if r["mode"] == mode]
        summary[mode] = {"first_step_s": statistics.median(r["first_step_s"] for r in rs),
                         "steps_lost": statistics.median(r["steps_lost"] for r in rs),
                         "all_succeeded": all(r["outcome"] == "SUCCEEDED" for r in rs)}
    print(json.dumps(summary))
    os.makedirs(os.path.join(HERE, "bench", "results"), exist_ok=True)
    with open(os.path.join(HERE, "bench", "results", "live_recovery.json"), "w") as f:
        json.dump({"runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
