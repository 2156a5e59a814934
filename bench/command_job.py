#!/usr/bin/python3
"""Command jobs: submit -> first reported step, and kill -> next attempt's first step.

    /usr/bin/python3 bench/command_job.py [--repeats 5] [--out bench/results/command_job.json]

Starts a local cluster (a ddp-coordinator and two ddp-worker agents on loopback, CPU,
long poll on) and runs examples/pytorch/train.py, a torchrun-style PyTorch DDP script
(Debian's python3-torch, Gloo, 2 DataLoader workers per rank), as a 2-node command job:

  start:    the job's submit_ms -> the coordinator's receipt of the first `step` line of
            the slower rank (training has started everywhere). The same figure for the
            built-in trainer's breast-cancer job is taken alternately in the same run,
            for scale: the difference is Python starting and importing torch.
  restart:  SIGKILL to rank 1 in epoch 2 (the script checkpoints every epoch) -> the
            first `step` line of attempt 2 from every rank: detection, stopping rank 0
            and its DataLoader workers, the new rendezvous, Python and torch starting
            again, the checkpoint loaded.

Medians over the repeats.
"""

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from start_latency import ROOT, job_file, start_cluster, write_results  # noqa: E402


def get(cluster, job_id):
    return json.loads(cluster.ctl("get", job_id, "--history", "-o", "json"))


def wait(cluster, job_id, pred, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = get(cluster, job_id)
        if pred(j):
            return j
        if j.get("state") in ("FAILED", "CANCELLED"):
            raise RuntimeError(f"job {job_id}: {j.get('state')} {j.get('reason')}")
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id}: timed out in state {j.get('state')}")


def first_steps(job, attempt):
    """rank -> the coordinator's receipt (ms) of its first step of `attempt`."""
    firsts = {}
    for m in job.get("history", []):
        if int(m.get("attempt", 0)) != attempt:
            continue
        r = int(m.get("rank", 0))
        t = int(m.get("update_ms", m.get("updateMs", 0)))
        firsts[r] = min(firsts.get(r, t), t)
    return firsts


def script_job(workdir, name, args):
    path = os.path.join(workdir, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(f"name: {name}\nnodes: 2\nmax_restarts: 2\n"
                f"command: [/usr/bin/python3, train.py, --data, {ROOT}/data/breast_cancer.csv, "
                f"{args}]\n")
    return path


def submit(cluster, path):
    return json.loads(cluster.ctl("submit", path, "-o", "json"))["id"]


def start_latency(cluster, path):
    job_id = submit(cluster, path)
    j = wait(cluster, job_id, lambda j: j.get("state") == "SUCCEEDED")
    firsts = first_steps(j, 1)
    if len(firsts) != 2:
        raise RuntimeError(f"job {job_id}: steps from ranks {sorted(firsts)}")
    return (max(firsts.values()) - int(j.get("submit_ms", j.get("submitMs", 0)))) / 1000.0


def restart_time(cluster, path):
    job_id = submit(cluster, path)

    def in_epoch_2(j):
        return j.get("state") == "RUNNING" and any(
            int(m.get("epoch", 0)) >= 2 for m in j.get("metrics", []))

    j = wait(cluster, job_id, in_epoch_2)
    pid = int(j["attempts"][0]["ranks"][1]["pid"])
    killed_ms = time.time() * 1000
    os.kill(pid, signal.SIGKILL)
    j = wait(cluster, job_id, lambda j: len(first_steps(j, 2)) == 2)
    restart = (max(first_steps(j, 2).values()) - killed_ms) / 1000.0
    cluster.ctl("cancel", job_id)
    return restart


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "command_job.json"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ddp-command-bench-")
    work = os.path.join(tmp, "work")
    os.makedirs(work)
    shutil.copy(os.path.join(ROOT, "examples", "pytorch", "train.py"), work)
    builtin = job_file(tmp)
    runs = {"script_start_s": [], "trainer_start_s": [], "script_restart_s": []}
    cluster = None
    try:
        cluster = start_cluster(tmp, "cmd", True)
        short = script_job(work, "short", "--epochs, '1'")
        long = script_job(work, "long", "--epochs, '50', --step-sleep, '0.01'")
        for i in range(args.repeats):
            runs["script_start_s"].append(start_latency(cluster, short))
            runs["trainer_start_s"].append(start_latency(cluster, builtin))
            runs["script_restart_s"].append(restart_time(cluster, long))
            print(f"run {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items()),
                  flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        os.remove(builtin)
        shutil.rmtree(tmp, ignore_errors=True)
    write_results(args.out, args.repeats, runs, "medians")


if __name__ == "__main__":
    sys.exit(main())
