#!/usr/bin/python3
"""Submit -> first training step on a local 2-worker cluster (benchmark item 6).

    /usr/bin/python3 bench/start_latency.py [--repeats 10] [--out bench/results/start_latency.json]

Starts two local clusters side by side (a ddp-coordinator and two ddp-worker agents
each, on loopback, CPU): one whose agents keep a WaitForTasks long poll open (the
default), one with --long-poll=false (new tasks arrive only with the next heartbeat,
the previous design). Then, alternating between them, submits the breast-cancer
example (2 nodes, 1 rank each, 20 steps) and measures the time from the job's
submit_ms to the coordinator receiving the first step event of every rank (the
slowest rank's first step: training has started everywhere). Medians over the
repeats; each figure is taken side by side under the same machine load.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from benchkit import cluster  # noqa: E402  (bench/benchkit.py: the tests' cluster)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_cluster(tmp, name, long_poll):
    """A coordinator and two workers (NAME-w1, NAME-w2) under tmp, their agents keeping a
    WaitForTasks long poll open or not; once both are alive."""
    c = cluster(2, names=name, dir=tmp,
                worker_flags=[f"--long-poll={'true' if long_poll else 'false'}"])
    try:
        c.wait_for_workers(timeout=60)
    except BaseException:
        c.stop()
        raise
    return c


def job_file(tmp):
    """The cancer example, 20 steps, every step reported, no checkpoints."""
    src = os.path.join(ROOT, "examples", "cancer.yaml")
    text = open(src).read()
    text = text.replace("epochs: 100", "epochs: 1\n  max_steps: 20")
    text = text.replace("checkpoint:\n  dir: \"../checkpoints/{job_id}\"\n  every_epochs: 5\n",
                        "")
    path = os.path.join(ROOT, "examples", f".start-latency-{os.getpid()}.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def start_latency(cluster, job):
    out = cluster.ctl("submit", job, "-o", "json")
    job_id = json.loads(out)["id"]
    deadline = time.time() + 120
    while time.time() < deadline:
        got = json.loads(cluster.ctl("get", job_id, "--history", "-o", "json"))
        if got.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.3)
    firsts = {}
    for m in got.get("history", []):
        r = m.get("rank", 0)
        t = int(m.get("update_ms", m.get("updateMs", 0)))
        firsts[r] = min(firsts.get(r, t), t)
    if got.get("state") != "SUCCEEDED" or len(firsts) != 2:
        raise RuntimeError(f"job {job_id}: {got.get('state')} {got.get('reason')}")
    return (max(firsts.values()) - int(got.get("submit_ms", got.get("submitMs", 0)))) / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "start_latency.json"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ddp-start-latency-")
    job = job_file(tmp)
    clusters = {}
    try:
        clusters["long_poll"] = start_cluster(tmp, "lp", True)
        clusters["heartbeat_only"] = start_cluster(tmp, "hb", False)
        runs = {k: [] for k in clusters}
        for i in range(args.repeats):
            for name, c in clusters.items():
                s = start_latency(c, job)
                runs[name].append(s)
                print(f"run {i + 1}: {name}: {s:.3f} s", flush=True)
    finally:
        for c in clusters.values():
            c.stop()
        os.remove(job)
        shutil.rmtree(tmp, ignore_errors=True)
    write_results(args.out, args.repeats, runs, "submit_to_first_step_s")


def write_results(path, repeats, runs, key):
    """Writes the runs and their medians (under `key`) as JSON, and prints the medians."""
    result = {
        "machine": f"{platform.node()} ({os.cpu_count()} cores)",
        "repeats": repeats,
        key: {k: statistics.median(v) for k, v in runs.items()},
        "runs": runs,
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    for k, v in result[key].items():
        print(f"{k}: median {v:.3f} s over {repeats}")


if __name__ == "__main__":
    sys.exit(main())
