#!/usr/bin/env python3
"""Recovery from faults on a real 2-worker cluster with default settings.

For each fault, on a fresh loopback cluster (ddp-coordinator with its default
timing, two or three ddp-workers, the real ddp-trainer on Gloo) running a
checkpointing job: inject the fault once the job has stepped, then read from the
coordinator's record (`ddpctl get -o json --history`):

  detection   the failed attempt's end_ms minus the fault's time
  first step  the first step metric of the next attempt (update_ms: when the
              coordinator received it) minus the fault's time

Faults:
  trainer_kill     kill -9 rank 1's trainer
  agent_kill       kill -9 w2's agent, a replacement w3 started 2 s later
  agent_elastic    kill -9 w2's agent, no replacement, nodes "1:2"
  trainer_stop     SIGSTOP rank 1's trainer (the stall watchdog; default timeout:
                   learned, at least 30 s)

Usage: python3 bench/recovery.py [FAULT ...]   (results: bench/results/recovery.json)
"""
import json
import os
import signal
import sys
import time

from benchkit import cluster  # noqa: E402  (bench/benchkit.py: the tests' cluster)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = """name: recovery
nodes: "{nodes}"
max_restarts: 3
model: {{mlp: {{hidden: [128, 128]}}}}
data: {{synthetic: {{samples: 20000, features: 64, classes: 10}}}}
train: {{epochs: 3, batch_size: 32, threads: 1}}
metrics: {{every_steps: 10}}
checkpoint: {{dir: "ckpt-{{node}}", every_steps: 50}}
"""


def wait(pred, timeout=300, every=0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError("timed out")


def run(fault):
    c = cluster(2)  # agent_kill: w3, the replacement, comes later.
    try:
        c.wait_for_workers()
        spec = os.path.join(c.dir, "job.yaml")
        with open(spec, "w") as f:
            f.write(JOB.format(nodes="1:2" if fault == "agent_elastic" else "2"))
        job_id = c.ctl("submit", spec).strip()

        def stepped():
            j = c.job(job_id)
            ms = j.get("metrics", [])
            return j if j.get("state") == "RUNNING" and len(ms) == 2 and \
                min(int(m.get("global_step", 0)) for m in ms) > 60 else None
        j = wait(stepped)
        rank1 = next(r for r in j["attempts"][0]["ranks"] if r.get("rank", 0) == 1)
        t_fault = time.time()
        if fault == "trainer_kill":
            os.kill(int(rank1["pid"]), signal.SIGKILL)
        elif fault == "trainer_stop":
            os.kill(int(rank1["pid"]), signal.SIGSTOP)
        else:
            c.process(rank1["worker"]).kill()
        if fault == "agent_kill":
            time.sleep(2)
            c.add_worker("w3")
        wait(lambda: c.job(job_id)["attempts"][0]["state"] == "FAILED", every=0.02)
        if fault == "trainer_stop":
            try:
                os.kill(int(rank1["pid"]), signal.SIGCONT)
            except ProcessLookupError:
                pass

        def next_step():
            j = c.job(job_id, history=True)
            firsts = [int(m["update_ms"]) for m in j.get("history", [])
                      if int(m.get("attempt", 0)) == 2]
            return (j, min(firsts)) if firsts else None
        j, first = wait(next_step, every=0.1)
        end_ms = int(j["attempts"][0]["end_ms"])
        result = {"fault": fault,
                  "detection_s": round(end_ms / 1000 - t_fault, 2),
                  "first_step_s": round(first / 1000 - t_fault, 2),
                  "reason": j["attempts"][0].get("reason", ""),
                  "next_world": j["attempts"][1].get("world_size")}
        wait(lambda: c.job(job_id)["state"] in ("SUCCEEDED", "FAILED"), timeout=600)
        result["outcome"] = c.job(job_id)["state"]
        return result
    finally:
        c.stop()


def main():
    faults = sys.argv[1:] or ["trainer_kill", "agent_kill", "agent_elastic", "trainer_stop"]
    results = []
    for fault in faults:
        r = run(fault)
        print(json.dumps(r), flush=True)
        results.append(r)
    os.makedirs(os.path.join(HERE, "bench", "results"), exist_ok=True)
    with open(os.path.join(HERE, "bench", "results", "recovery.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
