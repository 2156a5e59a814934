"""The chaos soak: jobs of both kinds run while a seeded schedule of faults hits the
cluster, then the invariants are checked.

    python3 tests/multihost/chaos_soak.py BIN_DIR SOURCE_DIR [--seconds S] [--seed N]

A coordinator and four workers of two slots, each on a host of its own
(tests/multihost/netns.py). For S seconds (default 180) two jobs at a time run, the
built-in trainer with checkpoints and a command job, taking turns, while the schedule,
drawn from the seed (random unless --seed; printed first, and again on a failure),
injects one fault at a time, each healed before the next:

  kill-worker          SIGKILL to a worker (its ranks die with it), restarted 2-6 s later
  kill-rank            SIGKILL to one live rank process of a running job
  cut-control          a worker cut from the coordinator's port, both ways, 3-8 s
  isolate              a worker's host cut from everyone, 3-8 s
  slow                 every link +20 ms each way and 1% lossy, 5-10 s
  restart-coordinator  the coordinator killed, started again 2-6 s later

Then, with every fault healed and the last jobs ended, the invariants:
- every job SUCCEEDED, or FAILED with a reason that names its fault;
- no rank of a job ever had two live processes (sampled every 50 ms from /proc);
- no job's newest checkpoint ever went back;
- nothing is left: no rank process of any job, no namespace;
- the seed reproduces the schedule (drawn twice, compared).
Skips (exit 77) where namespaces or iptables are missing.
"""
import argparse
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_on_hosts import Checks, DdpOnHosts, Watch, rank_processes  # noqa: E402
from netns import SKIP, Hosts  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("bindir")
ap.add_argument("source")
ap.add_argument("--seconds", type=float, default=180)
ap.add_argument("--seed", type=int, default=None)
args = ap.parse_args()
bindir, source = os.path.abspath(args.bindir), os.path.abspath(args.source)
seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
why = Hosts.unavailable() or Hosts.no_iptables()
if why:
    print("SKIP: " + why)
    sys.exit(SKIP)
netem = os.path.join(bindir, "ddp-test-netem")
WORKERS = {1: "w1", 2: "w2", 3: "w3", 4: "w4"}
KINDS = ["kill-worker", "kill-rank", "cut-control", "isolate", "slow", "restart-coordinator"]
# What a job that failed because of a fault says: its reason must name one of these.
FAULT_WORDS = re.compile(r"lost|killed|signal|SIGKILL|exit|restart|unreachable|connection")


def schedule(seed, seconds):
    """[(start offset s, kind, worker index, duration s)]: one fault at a time, a calm
    3-6 s between the end of one and the start of the next."""
    rng = random.Random(seed)
    out, t = [], 8.0  # The first jobs get going first.
    while True:
        kind = rng.choice(KINDS)
        target = rng.choice(sorted(WORKERS))
        duration = {"kill-worker": rng.uniform(2, 6), "kill-rank": 0.0,
                    "cut-control": rng.uniform(3, 8), "isolate": rng.uniform(3, 8),
                    "slow": rng.uniform(5, 10), "restart-coordinator": rng.uniform(2, 6)}[kind]
        if t + duration > seconds:
            return out
        out.append((round(t, 2), kind, target, round(duration, 2)))
        t += duration + rng.uniform(3, 6)


JOBS = {
    "builtin": ("name: chaos-builtin\nnodes: 2\nnproc_per_node: 1\nmax_restarts: 20\n"
                "model: {mlp: {hidden: [128]}}\n"
                "data: {csv: {path: %(data)s, skip_rows: 1, label_column: -1, standardize: true}}\n"
                "train: {epochs: 6, batch_size: 8, optimizer: {name: adam, lr: 0.001}}\n"
                "checkpoint: {dir: \"%(ckpt)s\", every_steps: 10}\n"),
    "command": ("name: chaos-command\nnodes: 2\nnproc_per_node: 1\nmax_restarts: 20\n"
                "command: [/usr/bin/python3, %(ticker)s]\n"),
}
TICKER = "import time\nfor i in range(80):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n"


class Soak:
    def __init__(self, hosts, tmp):
        self.hosts, self.tmp = hosts, tmp
        self.ddp = DdpOnHosts(hosts, bindir, tmp, workers=WORKERS,
                              coordinator_args=("--command-jobs", "users"),
                              worker_args=("--slots", "2", "--allow-exec", "/usr/bin/python3"))
        self.job_ids, self.ckpt_dirs = set(), []
        self.submitted = 0
        self.ended = {}
        self.coordinator_down = False
        self.stopping = False
        self.ticker = os.path.join(tmp, "ticker.py")
        with open(self.ticker, "w") as f:
            f.write(TICKER)

    def submit(self):
        kind = "builtin" if self.submitted % 2 == 0 else "command"
        ckpt = os.path.join(self.tmp, "ckpt-%d" % self.submitted)
        spec = os.path.join(self.tmp, "job-%d.yaml" % self.submitted)
        with open(spec, "w") as f:
            f.write(JOBS[kind] % {"data": os.path.join(source, "data", "breast_cancer.csv"),
                                  "ckpt": ckpt, "ticker": self.ticker})
        job = self.ddp.submit(0, spec)
        self.submitted += 1
        self.job_ids.add(job)
        if kind == "builtin":
            self.ckpt_dirs.append(ckpt)

    def tend(self):
        """Keeps two jobs in flight (while the coordinator answers)."""
        if self.coordinator_down:
            return
        for job in sorted(self.job_ids - set(self.ended)):
            try:
                j = self.ddp.job(0, job)
            except RuntimeError:
                return  # Restarting, or cut: next turn.
            if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                self.ended[job] = j
        if not self.stopping and len(self.job_ids) - len(self.ended) < 2:
            try:
                self.submit()
            except RuntimeError as e:
                if "not a valid job" in str(e):
                    raise
                print("submit: %s" % e, flush=True)

    def inject(self, kind, target, duration, watch):
        """Applies one fault; returns the function that heals it."""
        h = self.hosts
        if kind == "kill-worker":
            self.ddp.kill_worker(WORKERS[target])
            return lambda: self.ddp.start_worker(target, WORKERS[target])
        if kind == "kill-rank":
            live = [pid for procs in (watch.samples[-1][1] if watch.samples else {}).values()
                    for pid, _, _ in procs]
            if live:
                try:
                    os.kill(random.Random(seed + len(watch.samples)).choice(live), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return lambda: None
        if kind == "cut-control":
            h.partition(target, 0, port=7700)
            return h.heal_links
        if kind == "isolate":
            h.cut(target)
            return lambda: h.heal(target)
        if kind == "slow":
            h.slow(netem, 20, 0.01, seed=seed)
            return h.fast
        self.ddp.kill_coordinator()
        self.coordinator_down = True

        def back():
            self.ddp.start_coordinator()
            self.ddp.wait_listening(0)
            self.coordinator_down = False
        return back


def main(tmp, check):
    plan = schedule(seed, args.seconds)
    check(plan == schedule(seed, args.seconds), "the seed reproduces the schedule")
    print("chaos soak: seed %d, %d faults in %.0f s: %s" % (
        seed, len(plan), args.seconds, ", ".join("%s@%.0fs" % (k, t) for t, k, _, _ in plan)),
        flush=True)
    with Hosts(5) as hosts:
        soak = Soak(hosts, tmp)
        soak.ddp.wait_listening(0)
        soak.ddp.wait_workers(0, WORKERS.values())
        watch = Watch(soak.job_ids, soak.ckpt_dirs)
        t0 = time.time()
        for start, kind, target, duration in plan:
            while time.time() - t0 < start:
                soak.tend()
                time.sleep(0.3)
            print("%6.1f s  %s %s for %.1f s" % (time.time() - t0, kind, WORKERS[target], duration),
                  flush=True)
            heal = soak.inject(kind, target, duration, watch)
            until = time.time() + duration
            while time.time() < until:
                soak.tend()
                time.sleep(0.3)
            heal()
        soak.stopping = True
        deadline = time.time() + 240
        while len(soak.ended) < len(soak.job_ids) and time.time() < deadline:
            soak.tend()
            time.sleep(0.5)
        watch.stop()
        for job in sorted(soak.job_ids):
            j = soak.ended.get(job) or soak.ddp.job(0, job)
            ok = j["state"] == "SUCCEEDED" or (
                j["state"] == "FAILED" and FAULT_WORDS.search(j.get("reason", "")))
            check(ok, "%s (%s): %s after %d attempt(s) %s" % (
                job, j["name"], j["state"], len(j.get("attempts", [])), j.get("reason", "")))
        def during(t):  # When, and after which fault, for a failure's message.
            started = [(s, k, WORKERS[w]) for s, k, w, _ in plan if t0 + s <= t]
            if not started:
                return "%.1f s" % (t - t0)
            s, k, w = started[-1]
            return "%.1f s, %.1f s after %s %s" % (t - t0, t - t0 - s, k, w)

        doubles = ["%s: %s %s" % (during(t), key, procs) for t, key, procs in watch.doubles()]
        check(doubles == [], "no rank ever had two live processes (%d samples)%s" % (
            len(watch.samples), "" if not doubles else ": %s" % doubles[:3]))
        check(watch.backwards() == [], "no checkpoint went back (%d directories)%s" % (
            len(soak.ckpt_dirs), "" if not watch.backwards() else ": %s" % watch.backwards()[:3]))
        jobs = set(soak.job_ids)
        print("chaos soak: %d jobs, %d faults, seed %d" % (len(jobs), len(plan), seed))
    check(rank_processes(jobs) == {}, "no rank process left")
    check(hosts.leftovers() == [], "no namespace left")


check = Checks()
tmp = tempfile.mkdtemp(prefix="ddp-chaos-")
try:
    main(tmp, check)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
if check.failures:
    print("chaos soak FAILED with seed %d: rerun with --seed %d" % (seed, seed))
check.exit()
