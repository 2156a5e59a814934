#!/usr/bin/python3
"""The same PyTorch 2.x DDP script under torchrun and as a ddp command job, on one host.

    /usr/bin/python3 bench/torchrun_vs_ddp.py [--repeats 5] [--bin build/bin]
        [--venv .venv-torch2] [--out bench/results/torchrun_vs_ddp.json]

The script is examples/pytorch/train.py (Gloo, DistributedSampler, 2 DataLoader workers
per rank, a rank-0 checkpoint every epoch), run by the venv's Python (PyTorch 2.11) on
both sides, 2 ranks on this host:

  torchrun: the venv's own `torchrun --standalone --nproc_per_node=2 --max-restarts 1`,
            started fresh for every run (that is how torchrun is used: it is the launcher
            and the agent of one run). The ranks print their ddp_report lines to stdout
            (DDP_REPORT_STDOUT=1; ddp_report.py from python/ on PYTHONPATH, as a command
            job gets it), which the bench reads from torchrun's stdout.
  ddp:      a standing local cluster (a ddp-coordinator and ONE ddp-worker with 2 slots on
            loopback: one agent running both ranks of one node, as torchrun's one agent
            with --nproc_per_node=2 does), a command job with nodes: 1, nproc_per_node: 2,
            max_restarts: 1, command: [<venv>/bin/python, train.py, ...].

Measured, alternately (the side that goes first alternates from repeat to repeat):

  start:    the bench's clock just before it runs the launcher's command (`torchrun ...`,
            `ddpctl submit ...`) -> the first step of the slower rank (a 1-epoch run).
  restart:  SIGKILL to rank 1's Python process once a step of epoch 2 is seen (the script
            has checkpointed epochs 0 and 1) -> the first step of the next attempt from
            both ranks (it resumes at epoch 2 from the checkpoint). The run then goes on
            to its end (6 epochs), so each launcher's own account of the failure and its
            exit status are recorded too.

"First step" is the step line of step 0: under torchrun the time the rank wrote into the
line itself (ddp_report's "time", taken just after the step), for ddp the coordinator's
receipt of that line (the history's update_ms, as bench/command_job.py): ddp's figure
includes the relay rank -> agent -> coordinator, a few ms, that torchrun's does not.

torchrun 2.11 runs the restart twice: with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the timed
figure) and with its default. By default the ranks of every attempt use one TCPStore, the
agent's, created at the first rendezvous round and kept for the later ones
(dynamic_rendezvous.py: `if self._bootstrap_store_info is None`), and init_process_group
puts no per-attempt prefix on it (rendezvous.py: "We create a new TCPStore for every retry
so no need to add prefix for each attempt"): the next attempt's Gloo rendezvous can read
the previous attempt's addresses, and then fails with "Connection reset by peer" (pytorch
issue 135712). How often that happened is recorded (torchrun_default_restarts).

Once after the repeats, each side is made to fail for good (rank 1 killed in attempt 1
and again in attempt 2, which max_restarts 1 does not cover), and what each then reports
is recorded. Medians and ranges over the repeats go to --out, with excerpts of both
launchers' reports.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchkit import cluster  # noqa: E402  (bench/benchkit.py: the tests' cluster)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data", "breast_cancer.csv")
PYTHON_DIR = os.path.join(ROOT, "python")  # ddp_report.py, the same file ddp's agent adds
START_EPOCHS, RESTART_EPOCHS, STEP_SLEEP, KILL_EPOCH = 1, 6, 0.01, 2
TIMEOUT = 180


def script_args(ckpt, epochs):
    return ["train.py", "--data", DATA, "--checkpoint-dir", ckpt, "--epochs", str(epochs),
            "--step-sleep", str(STEP_SLEEP)]


# ---------------------------------------------------------------------------- torchrun

class Torchrun:
    """One torchrun run; its stdout and stderr read line by line by two threads."""

    def __init__(self, venv, work, ckpt, epochs, share_store=True):
        env = dict(os.environ)
        env.pop("DDP_EVENTS_FD", None)
        env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        if not share_store:  # The workaround for restarts (see the module's docstring).
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("PYTHONPATH"), PYTHON_DIR) if p)
        env["DDP_REPORT_STDOUT"] = "1"  # ddp_report's lines to stdout, each with its time
        self.lines = []  # (stream, text), in the order read
        self.cond = threading.Condition()
        self.rank_pids = {}  # pid -> its start time
        self.t0 = time.time()
        self.proc = subprocess.Popen(
            [os.path.join(venv, "bin", "torchrun"), "--standalone", "--nproc_per_node=2",
             "--max-restarts", "1", *script_args(ckpt, epochs)],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self.threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in self.threads:
            t.start()

    def _read(self, pipe, name):
        for raw in iter(pipe.readline, b""):
            with self.cond:
                self.lines.append((name, raw.decode("utf-8", "replace").rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pred, what, timeout=TIMEOUT):
        """Waits until pred(lines) is true (returns its value); raises if torchrun ends first."""
        deadline = time.time() + timeout
        with self.cond:
            while True:
                v = pred(self.lines)
                if v:
                    return v
                if self.proc.poll() is not None and not any(t.is_alive() for t in self.threads):
                    raise RuntimeError(f"torchrun exited {self.proc.returncode} before {what}: "
                                       + "\n".join(t for _, t in self.lines[-20:]))
                if time.time() > deadline:
                    raise RuntimeError(f"torchrun: timed out waiting for {what}")
                self.cond.wait(0.05)

    def rank_pid(self, rank):
        """The pid of the rank's Python process: torchrun's child with RANK=rank."""
        for path in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(path) as f:
                    stat = f.read()
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[1]) != self.proc.pid:  # ppid
                    continue
                pid = int(path.split("/")[2])
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except (OSError, ValueError):
                continue
            self.rank_pids[pid] = fields[19]  # starttime: tells a reused pid apart
            if env.get(b"RANK") == str(rank).encode():
                return pid
        return None

    def finish(self):
        """Waits for torchrun's exit; its exit status."""
        rc = self.proc.wait(timeout=TIMEOUT)
        for t in self.threads:
            t.join(timeout=10)
        return rc

    def stop(self):
        """Ends the run and every rank it started (each rank is in a session of its own)."""
        if self.proc.poll() is None:
            self.rank_pid(-1)  # Records the current ranks' pids.
            self.proc.send_signal(signal.SIGTERM)  # torchrun stops its workers, then exits.
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid, started in self.rank_pids.items():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                if stat[stat.rindex(")") + 2:].split()[19] == started and os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)  # The rank and its DataLoader workers.
            except (OSError, ValueError):
                pass
        for s in (self.proc.stdout, self.proc.stderr):
            s.close()


def steps(lines, start=0):
    """The step lines (dicts) among lines[start:]."""
    out = []
    for stream, text in lines[start:]:
        if stream == "out" and text.startswith("{") and '"type": "step"' in text:
            try:
                out.append(json.loads(text))
            except ValueError:
                pass
    return out


def first_step_lines(lines, start=0, n=2):
    """The step-0 lines of the first n ranks to step, among lines[start:]; else None."""
    firsts = [s for s in steps(lines, start) if s.get("step") == 0]
    return firsts[:n] if len(firsts) >= n else None


def header_index(lines, start, restart_count):
    """The index of the first rank header line of restart count `restart_count` after start."""
    for i in range(start, len(lines)):
        stream, text = lines[i]
        if stream == "out" and re.search(r"^rank \d+/\d+ \(local rank.*restart count %d$"
                                         % restart_count, text):
            return i
    return None


def report_excerpt(lines, start):
    """torchrun's stderr from `start` on, without its OMP_NUM_THREADS banner."""
    return [t for s, t in lines[start:] if s == "err" and "OMP_NUM_THREADS" not in t
            and not t.endswith("] ") and not t.endswith("*****")]


def torchrun_start(venv, work, ckpt):
    tr = Torchrun(venv, work, ckpt, START_EPOCHS)
    try:
        rc = tr.finish()
        firsts = first_step_lines(tr.lines)
        if rc != 0 or firsts is None:
            raise RuntimeError(f"torchrun exited {rc}: " + "\n".join(t for _, t in tr.lines[-20:]))
        return max(s["time"] for s in firsts) - tr.t0
    finally:
        tr.stop()


def torchrun_kill_rank1(tr, start, restart_count):
    """Kills rank 1 once a step of the current attempt in epoch KILL_EPOCH+ is seen (attempt
    2: once both its ranks have stepped); the kill's time and the index of the next line."""
    if restart_count == 0:
        tr.wait_for(lambda ls: any(s.get("epoch", 0) >= KILL_EPOCH for s in steps(ls, start)),
                    f"a step of epoch {KILL_EPOCH}")
    pid = tr.rank_pid(1)
    if pid is None:
        raise RuntimeError("torchrun: no rank-1 process found")
    with tr.cond:
        mark = len(tr.lines)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    return killed, mark


def torchrun_next_attempt(tr, mark, restart_count, timeout=TIMEOUT):
    """The step-0 lines of both ranks of the attempt whose ranks print `restart_count`."""
    def ready(ls):
        h = header_index(ls, mark, restart_count)
        return None if h is None else first_step_lines(ls, h)
    return tr.wait_for(ready, f"attempt {restart_count + 1}'s first steps", timeout)


def torchrun_restart(venv, work, ckpt, share_store=False, exhaust=False):
    """SIGKILL to rank 1 in epoch 2 -> both ranks' first step of the next attempt (seconds,
    None if that attempt never stepped); with exhaust, rank 1 is killed again in attempt 2.
    Returns (seconds, report)."""
    tr = Torchrun(venv, work, ckpt, RESTART_EPOCHS, share_store)
    try:
        killed, mark = torchrun_kill_rank1(tr, 0, 0)
        try:
            firsts = torchrun_next_attempt(tr, mark, 1, 90 if share_store else TIMEOUT)
            restart = max(s["time"] for s in firsts) - killed
        except RuntimeError as e:
            if tr.proc.poll() is None and share_store:  # Hung rather than failed.
                tr.stop()
            elif not share_store:
                raise
            restart, firsts = None, str(e).splitlines()[0]
        if exhaust and restart is not None:
            killed, mark = torchrun_kill_rank1(tr, mark, 1)
        rc = tr.finish()
        resumed = [t for s, t in tr.lines[mark:] if s == "out" and "resumed from epoch" in t]
        report = {"exit_code": rc, "attempt_2_stepped": restart is not None,
                  "stderr_after_kill": report_excerpt(tr.lines, mark)[:60],
                  "resumed": resumed[:2],
                  "epochs_done": [t for s, t in tr.lines if s == "out" and t.startswith("epoch ")]}
        return restart, report
    finally:
        tr.stop()


# ---------------------------------------------------------------------------------- ddp

class Cluster:
    """A ddp-coordinator and one ddp-worker with 2 slots on loopback (bench/benchkit.py's
    cluster: the tests')."""

    def __init__(self, bindir, tmp):
        self.kit = cluster(1, bin_dir=bindir, dir=tmp, slots=2, cpus=os.cpu_count() or 2,
                           worker_flags=["--python-path", PYTHON_DIR])
        try:
            self.kit.wait_for_workers(timeout=60)
        except BaseException:
            self.kit.stop()
            raise
        self.dir = self.kit.dir

    def ctl(self, *args, check=True):
        return self.kit.ctl(*args, check=check)

    def get(self, job_id):
        return json.loads(self.ctl("get", job_id, "--history", "-o", "json"))

    def wait(self, job_id, pred, what, fail_ok=False, interval=0.5):
        """Polls `ddpctl get --history` every `interval` s until pred(job). The figures come
        from the coordinator's timestamps, not from when a poll sees them, so the polls in a
        timed window are sparse: each one starts a ddpctl and has the coordinator write the
        job's history, CPU that a 2-core machine's starting ranks would otherwise share."""
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            j = self.get(job_id)
            if pred(j):
                return j
            if j.get("state") in ("FAILED", "CANCELLED", "SUCCEEDED"):
                if not fail_ok or j.get("state") == "CANCELLED":
                    raise RuntimeError(f"job {job_id} {j.get('state')} before {what}: "
                                       f"{j.get('reason')}")
            time.sleep(interval)
        raise RuntimeError(f"job {job_id}: timed out waiting for {what}")

    def stop(self):
        self.kit.stop()


def job_file(work, name, ckpt, epochs, venv):
    path = os.path.join(work, f"{name}.yaml")
    cmd = [os.path.join(venv, "bin", "python"), *script_args(ckpt, epochs)]
    with open(path, "w") as f:
        f.write(f"name: {name}\nnodes: 1\nnproc_per_node: 2\nmax_restarts: 1\n"
                f"command: {json.dumps(cmd)}\n")
    return path


def first_steps(job, attempt):
    """rank -> the coordinator's receipt (ms) of its first step of `attempt`."""
    firsts = {}
    for m in job.get("history", []):
        if int(m.get("attempt", 0)) == attempt:
            r, t = int(m.get("rank", 0)), int(m.get("update_ms", 0))
            firsts[r] = min(firsts.get(r, t), t)
    return firsts


def ddp_start(cluster, path):
    t0 = time.time()
    job_id = json.loads(cluster.ctl("submit", path, "-o", "json"))["id"]
    j = cluster.wait(job_id, lambda j: j.get("state") == "SUCCEEDED", "its end")
    firsts = first_steps(j, 1)
    if len(firsts) != 2:
        raise RuntimeError(f"job {job_id}: steps from ranks {sorted(firsts)}")
    return max(firsts.values()) / 1000.0 - t0, max(firsts.values()) / 1000.0 - int(
        j["submit_ms"]) / 1000.0


def ddp_kill_rank1(cluster, job_id, attempt):
    if attempt == 1:
        j = cluster.wait(job_id, lambda j: j.get("state") == "RUNNING" and any(
            int(m.get("epoch", 0)) >= KILL_EPOCH for m in j.get("metrics", [])),
            f"a step of epoch {KILL_EPOCH}", interval=0.05)
    else:
        j = cluster.get(job_id)
    a = [a for a in j["attempts"] if int(a["number"]) == attempt][0]
    pid = int([r for r in a["ranks"] if int(r["rank"]) == 1][0]["pid"])
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    return killed


def ddp_report(cluster, job_id, j):
    attempts = [{"number": a["number"], "state": a["state"], "reason": a["reason"],
                 "ranks": [{k: r.get(k) for k in ("rank", "exit_code", "signal", "error")}
                           for r in a["ranks"]]} for a in j["attempts"]]
    text = cluster.ctl("get", job_id)
    keep = [ln for ln in text.splitlines() if ln.startswith(("State:", "Reason:", "Restarts:"))
            or ln.startswith("Attempt ") or re.match(r"^\s+\d+\s+\d+\s+\d+\s+node", ln)]
    return {"state": j["state"], "reason": j["reason"], "restarts": j["restarts"],
            "attempts": attempts, "ddpctl_get": keep}


def ddp_restart(cluster, path, exhaust=False):
    job_id = json.loads(cluster.ctl("submit", path, "-o", "json"))["id"]
    killed = ddp_kill_rank1(cluster, job_id, 1)
    j = cluster.wait(job_id, lambda j: len(first_steps(j, 2)) == 2, "attempt 2's first steps")
    restart = max(first_steps(j, 2).values()) / 1000.0 - killed
    if exhaust:
        ddp_kill_rank1(cluster, job_id, 2)
    # The end, and every rank's exit recorded (a job fails at its first rank's exit).
    j = cluster.wait(job_id, lambda j: j.get("state") in ("SUCCEEDED", "FAILED") and all(
        r.get("exited") for a in j["attempts"] for r in a["ranks"]), "its end", fail_ok=True)
    a1 = [a for a in j["attempts"] if int(a["number"]) == 1][0]
    return restart, int(a1["end_ms"]) / 1000.0 - killed, ddp_report(cluster, job_id, j)


# --------------------------------------------------------------------------------- main

def summary(v):
    return {"median": round(statistics.median(v), 3), "min": round(min(v), 3),
            "max": round(max(v), 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                    help="where ddp-coordinator, ddp-worker and ddpctl are")
    ap.add_argument("--venv", default=os.path.join(ROOT, ".venv-torch2"),
                    help="the virtualenv with PyTorch 2.x (its python and torchrun)")
    ap.add_argument("--no-exhaust", action="store_true",
                    help="skip the final runs that exhaust max_restarts")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "torchrun_vs_ddp.json"))
    args = ap.parse_args()
    args.bin, args.venv = os.path.abspath(args.bin), os.path.abspath(args.venv)
    torch_version = subprocess.run(
        [os.path.join(args.venv, "bin", "python"), "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, check=True).stdout.strip()

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)

    tmp = tempfile.mkdtemp(prefix="ddp-torchrun-bench-")
    work, ckpt = os.path.join(tmp, "work"), os.path.join(tmp, "checkpoints")
    os.makedirs(work)
    shutil.copy(os.path.join(ROOT, "examples", "pytorch", "train.py"), work)
    runs = {k: [] for k in ("torchrun_start_s", "ddp_start_s", "ddp_submit_ms_to_first_step_s",
                            "torchrun_restart_s", "ddp_restart_s", "ddp_kill_to_attempt_end_s")}
    reports = {}
    default_outcomes = []  # torchrun's restarts with its default shared store
    load = [os.getloadavg()[0]]
    cluster = None
    try:
        cluster = Cluster(args.bin, tmp)
        short = job_file(work, "short", ckpt, START_EPOCHS, args.venv)
        long = job_file(work, "long", ckpt, RESTART_EPOCHS, args.venv)
        for i in range(args.repeats):
            def tr_start():
                runs["torchrun_start_s"].append(torchrun_start(args.venv, work, ckpt))

            def ddp_s():
                s, from_submit = ddp_start(cluster, short)
                runs["ddp_start_s"].append(s)
                runs["ddp_submit_ms_to_first_step_s"].append(from_submit)

            def tr_default_restart():
                s, reports["torchrun_default_restart"] = torchrun_restart(
                    args.venv, work, ckpt, share_store=True)
                r = reports["torchrun_default_restart"]
                default_outcomes.append({"attempt_2_stepped": r["attempt_2_stepped"],
                                         "restart_s": s, "exit_code": r["exit_code"]})

            def tr_restart():
                s, reports["torchrun_restart"] = torchrun_restart(args.venv, work, ckpt)
                runs["torchrun_restart_s"].append(s)
                if reports["torchrun_restart"]["exit_code"] != 0:
                    raise RuntimeError(f"torchrun: {reports['torchrun_restart']}")

            def ddp_r():
                s, end, reports["ddp_restart"] = ddp_restart(cluster, long)
                runs["ddp_restart_s"].append(s)
                runs["ddp_kill_to_attempt_end_s"].append(end)
                if reports["ddp_restart"]["state"] != "SUCCEEDED":
                    raise RuntimeError(f"ddp: {reports['ddp_restart']}")

            order = [tr_start, ddp_s, tr_restart, ddp_r, tr_default_restart] if i % 2 == 0 \
                else [ddp_s, tr_start, ddp_r, tr_restart, tr_default_restart]
            for step in order:
                step()
            print(f"run {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items())
                  + f", torchrun default restart {default_outcomes[-1]}", flush=True)
        if not args.no_exhaust:
            _, reports["torchrun_exhausted"] = torchrun_restart(args.venv, work, ckpt,
                                                                exhaust=True)
            _, _, reports["ddp_exhausted"] = ddp_restart(cluster, long, True)
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    load.append(os.getloadavg()[0])
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {
        "machine": f"{platform.node()} ({os.cpu_count()} cores)",
        "date": datetime.date.today().isoformat(), "commit": commit, "torch": torch_version,
        "load_average_1m_before_after": load, "repeats": args.repeats,
        "seconds": {k: summary(v) for k, v in runs.items()},
        "torchrun_default_restarts": default_outcomes,
        "runs": runs, "reports": reports,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for k, v in result["seconds"].items():
        print(f"{k}: median {v['median']:.3f} s ({v['min']:.3f}-{v['max']:.3f}) "
              f"over {args.repeats}")


if __name__ == "__main__":
    sys.exit(main())
