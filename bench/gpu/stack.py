"""The full-stack GPU check: ddp-coordinator, ddp-worker and ddpctl running jobs on the GPU.

    python3 bench/gpu/stack.py --bin DIR --trainer PATH --data DIR --out DIR
        [--ctl-lib DIR] [--trainer-lib PATHS] [--python PY] [--dry-run]

Starts a real ddp-coordinator (a state dir in a temporary directory, Prometheus on
--metrics-listen) and one ddp-worker `gpu0` (which finds the GPU through NVML itself),
then submits three jobs with ddpctl and follows each with `ddpctl watch`, polling
`ddpctl get -o json` and the coordinator's /metrics every 0.5 s while it runs:

  fmnist-fp32   the built-in trainer: the Fashion-MNIST CNN on --data's IDX files, 3
                epochs, batch 64, Adam; backend auto must pick NCCL on cuda:0 and the
                last epoch's val_accuracy must reach 0.88; the per-rank GPU memory
                metrics (the trainer's CUDA caching allocator: peak above 0) must reach
                `ddpctl get`, and ddp_rank_gpu_* (memory, the worker's NVML utilization)
                the coordinator's /metrics
  fmnist-bf16   the same with train.precision bf16: within 0.5 points of fp32's accuracy
  torch-script  a command job: bench/gpu/torch_job.py, PyTorch's own DDP on NCCL; its
                step lines must reach the coordinator and its log must name the GPU

--bin holds ddp-coordinator, ddp-worker and ddpctl; --trainer is the ddp-trainer the
worker runs. --ctl-lib is the control plane's library directory (LD_LIBRARY_PATH of the
coordinator and ddpctl); the worker gets --trainer-lib first and --ctl-lib last (its
trainers inherit its LD_LIBRARY_PATH, and torch's and the machine's libraries must win
there). Results: OUT/stack.json (every check: name, passed, value), OUT/stack.md (the
tables for docs) and OUT/stack/ (the daemons' logs, each job's spec, `get`, watch and
logs). Exits 1 if any check failed.

--dry-run: the same on a CPU machine (CI): backend auto falls back to Gloo, the trainer
jobs stop after a few steps, and the accuracy and GPU-only checks are recorded, not
required. A binary that refuses train.precision (not built with it yet) skips the bf16
job in a dry run, saying so; on a GPU that fails the check.
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FMNIST = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
# Per rank in `ddpctl get -o json`: the trainer's CUDA caching allocator (metrics[]) and
# the worker's NVML sample of the rank's GPU (attempts[-1].ranks[]).
GPU_FIELDS = ("gpu_memory_allocated_mib", "gpu_memory_reserved_mib", "gpu_memory_peak_mib",
              "gpu_utilization_pct", "gpu_memory_used_mib")
GPU_SERIES = ("ddp_rank_gpu_memory_allocated_bytes", "ddp_rank_gpu_memory_peak_bytes",
              "ddp_rank_gpu_utilization_ratio")
GPU_NAME = re.compile(r"H100|H200|NVIDIA", re.I)
START_LINE = re.compile(r"rank (\d+)/(\d+) on (\S+) \((\w+)\)")
MIN_ACCURACY = 0.88
MAX_BF16_DELTA = 0.005


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def number(v):
    """A JSON value as a float (int64s come as strings), None if it is none."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def children_of(pids):
    """Every live descendant of `pids` (from /proc), to stop what a daemon started."""
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), list(pids)
    while todo:
        p = todo.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # A zombie counts as gone.
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Check:
    def __init__(self):
        self.rows = []

    def add(self, name, passed, value, note=""):
        """passed: True, False, or None (recorded only: a dry run, or not applicable)."""
        self.rows.append({"name": name, "passed": passed, "value": value, "note": note})
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[passed]
        shown = json.dumps(value, default=str)
        if len(shown) > 160:
            shown = shown[:157] + "..."
        print(f"[{mark}] {name}: {shown}" + (f"  ({note})" if note else ""), flush=True)

    def failed(self):
        return [r["name"] for r in self.rows if r["passed"] is False]


class Stack:
    def __init__(self, a, tmp, logs):
        self.a, self.tmp, self.logs = a, tmp, logs
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs = {}
        base = dict(os.environ)
        base.pop("DDP_COORDINATOR", None)
        self.ctl_env = dict(base)
        self.worker_env = dict(base)
        if a.ctl_lib:
            self.ctl_env["LD_LIBRARY_PATH"] = a.ctl_lib
            self.worker_env["LD_LIBRARY_PATH"] = ":".join(
                p for p in (a.trainer_lib, a.ctl_lib) if p)
        elif a.trainer_lib:
            self.worker_env["LD_LIBRARY_PATH"] = ":".join(
                p for p in (a.trainer_lib, base.get("LD_LIBRARY_PATH", "")) if p)

    def bin(self, name):
        return os.path.join(self.a.bin, name)

    def start(self, name, argv, env):
        log = open(os.path.join(self.logs, f"{name}.log"), "w")
        print(f"$ {' '.join(argv)}", file=log, flush=True)
        self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def log_tail(self, name, n=30):
        try:
            with open(os.path.join(self.logs, f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def check_running(self, name):
        p = self.procs[name]
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited {p.returncode}:\n{self.log_tail(name)}")

    def ctl(self, *args, timeout=30, check=False):
        r = subprocess.run([self.bin("ddpctl"), "--coordinator", self.address, *args],
                           env=self.ctl_env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise RuntimeError(f"ddpctl {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def ctl_json(self, *args, timeout=30):
        r = self.ctl(*args, "-o", "json", timeout=timeout)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def up(self):
        self.start("coordinator", [
            self.bin("ddp-coordinator"), "--listen", self.address,
            "--state-dir", os.path.join(self.tmp, "state"),
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}"], self.ctl_env)
        deadline = time.time() + 30
        while self.ctl("list", timeout=10).returncode != 0:
            self.check_running("coordinator")
            if time.time() > deadline:
                raise RuntimeError("the coordinator did not answer within 30 s:\n" +
                                   self.log_tail("coordinator"))
            time.sleep(0.2)
        self.start("worker", [
            self.bin("ddp-worker"), "--coordinator", self.address, "--name", "gpu0",
            "--trainer", self.a.trainer, "--work-dir", os.path.join(self.tmp, "work"),
            "--python-path", os.path.join(ROOT, "python"), "--stop-grace", "5s"],
            self.worker_env)
        deadline = time.time() + 60
        while True:
            self.check_running("worker")
            got = self.ctl_json("workers")
            for w in (got or {}).get("workers", []):
                if w.get("name") == "gpu0" and w.get("alive"):
                    return w
            if time.time() > deadline:
                raise RuntimeError("worker gpu0 did not register within 60 s:\n" +
                                   self.log_tail("worker"))
            time.sleep(0.3)

    def scrape(self):
        """The coordinator's ddp_rank_* series: {name: max value over its label sets}."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=2) as r:
                text = r.read().decode(errors="replace")
        except OSError:
            return None
        series = {}
        for line in text.splitlines():
            m = re.match(r"^(ddp_rank_\w+)(?:\{[^}]*\})?\s+(\S+)", line)
            if m:
                v = number(m.group(2))
                if v is not None:
                    series[m.group(1)] = max(series.get(m.group(1), v), v)
        return series

    def down(self):
        """SIGTERM the worker (it stops its trainers), then the coordinator; SIGKILL what
        is left of them and of anything they started."""
        started = [p.pid for p in self.procs.values()]
        spawned = children_of(started)
        for name in ("worker", "coordinator"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                print(f"stack.py: {name} did not stop within 15 s of SIGTERM: SIGKILL",
                      flush=True)
        spawned |= children_of(started)
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for pid in spawned:  # Trainers lead process groups of their own.
            if alive(pid):
                print(f"stack.py: pid {pid} outlived its daemon: SIGKILL", flush=True)
                for kill in (lambda: os.killpg(pid, signal.SIGKILL),
                             lambda: os.kill(pid, signal.SIGKILL)):
                    try:
                        kill()
                    except (ProcessLookupError, PermissionError):
                        pass


def fmnist_job(name, data, dry_run, precision=None):
    q = json.dumps  # YAML takes JSON strings: paths with any character in them.
    lines = [f"name: {name}", "nodes: 1", "nproc_per_node: 1", "backend: auto",
             "max_restarts: 0", "model:", "  cnn: {channels: [16, 32], kernel: 5, hidden: 128}",
             "data:", "  idx:",
             f"    images: {q(os.path.join(data, FMNIST[0]))}",
             f"    labels: {q(os.path.join(data, FMNIST[1]))}",
             "  validation:", "    idx:",
             f"      images: {q(os.path.join(data, FMNIST[2]))}",
             f"      labels: {q(os.path.join(data, FMNIST[3]))}",
             "train:", "  epochs: 3", "  batch_size: 64",
             "  optimizer: {name: adam, lr: 0.001}",
             "  stall_timeout_s: 120"]  # a busy CI machine must not read as a stall
    if dry_run:
        lines.append("  max_steps: 120")
    if precision:
        lines.append(f"  precision: {precision}")
    lines.append(f"metrics: {{every_steps: {10 if dry_run else 50}}}")
    return "\n".join(lines) + "\n"


def script_job(python, ctl_lib):
    argv = [python, os.path.join(HERE, "torch_job.py"), "--steps", "200"]
    if ctl_lib:
        argv += ["--drop-ld-path", ctl_lib]
    return ("name: torch-script\nnodes: 1\nnproc_per_node: 1\nbackend: auto\n"
            f"max_restarts: 0\ncommand: {json.dumps(argv)}\n")


def gpu_fields(job, seen):
    """Folds the GPU fields of a `get -o json` answer's per-rank metrics and rank table
    into `seen` (max), wherever in a rank's entry they are (flat, or nested)."""
    def walk(d):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v)
            elif k in seen and number(v) is not None:
                seen[k] = number(v) if seen[k] is None else max(seen[k], number(v))
    job = job or {}
    for m in job.get("metrics", []) + ((job.get("attempts") or [{}])[-1].get("ranks") or []):
        walk(m)


def run_job(stack, name, spec, timeout):
    """Submits, watches and reads back one job; polls metrics while it runs."""
    jobs_dir = os.path.join(stack.tmp, "jobs")
    os.makedirs(jobs_dir, exist_ok=True)
    path = os.path.join(jobs_dir, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(spec)
    shutil.copy(path, os.path.join(stack.logs, f"{name}.yaml"))
    res = {"name": name, "submitted": False}
    t0 = time.time()
    sub = stack.ctl("submit", path, timeout=60)
    if sub.returncode != 0:
        res["submit_error"] = (sub.stderr or sub.stdout).strip()
        print(f"{name}: submit refused (exit {sub.returncode}): {res['submit_error']}",
              flush=True)
        return res
    job = sub.stdout.strip().splitlines()[-1].strip()
    res.update(submitted=True, job_id=job)
    print(f"{name}: submitted as {job}", flush=True)
    watch_log = open(os.path.join(stack.logs, f"{name}.watch.txt"), "w")
    watch = subprocess.Popen([stack.bin("ddpctl"), "--coordinator", stack.address, "watch", job],
                             env=stack.ctl_env, stdout=watch_log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    watch_log.close()
    seen = {f: None for f in GPU_FIELDS}
    series, polls, scrapes, loss_seen, train_started = {}, 0, 0, False, None
    try:
        while watch.poll() is None:
            if time.time() - t0 > timeout:
                res["timed_out"] = True
                print(f"{name}: not done after {timeout} s: cancelling it", flush=True)
                stack.ctl("cancel", job, timeout=60)
                break
            got = stack.ctl_json("get", job, timeout=10)
            polls += 1
            for m in (got or {}).get("metrics", []):
                if number(m.get("loss")) is not None:
                    loss_seen = True
                    train_started = train_started or round(time.time() - t0, 1)
            gpu_fields(got, seen)
            scraped = stack.scrape()
            if scraped is not None:
                scrapes += 1
                for k, v in scraped.items():
                    series[k] = max(series.get(k, v), v)
            time.sleep(0.5)
    finally:
        try:
            watch.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(watch.pid, signal.SIGKILL)
            watch.wait()
    res["watch_rc"] = watch.returncode
    res["wall_s"] = round(time.time() - t0, 1)
    res["first_metrics_after_s"] = train_started
    got = stack.ctl_json("get", job) or {}
    gpu_fields(got, seen)
    with open(os.path.join(stack.logs, f"{name}.get.json"), "w") as f:
        json.dump(got, f, indent=1)
    logs = stack.ctl("logs", job, timeout=60).stdout
    with open(os.path.join(stack.logs, f"{name}.logs.txt"), "w") as f:
        f.write(logs)
    res["state"] = got.get("state")
    res["reason"] = got.get("reason")
    attempt = (got.get("attempts") or [{}])[-1]
    res["ranks"] = [{k: r.get(k) for k in ("rank", "worker", "exit_code", "signal", "error",
                                           "gpu_uuid")} for r in attempt.get("ranks", [])]
    metrics = {m.get("rank"): m for m in got.get("metrics", [])}
    res["rank0_metrics"] = metrics.get(0)
    res["loss_seen_while_running"] = loss_seen
    epochs = [e for e in got.get("epoch_history", [])
              if e.get("attempt") == attempt.get("number")]
    res["epochs"] = [{"epoch": int(e.get("epoch", 0)),
                      "train_loss": number(e.get("train_loss")),
                      "val_accuracy": number(e.get("val_accuracy"))} for e in epochs]
    res["val_accuracy"] = res["epochs"][-1]["val_accuracy"] if epochs else None
    start = START_LINE.search(logs)
    res["device"], res["backend"] = (start.group(3), start.group(4)) if start else (None, None)
    dev = re.search(r"^\[rank 0\] device: (.+)$", logs, re.M)
    res["device_name"] = dev.group(1).strip() if dev else None
    res["gpu_fields_max"] = seen
    res["rank_series_max"] = series
    res["polls"], res["scrapes"] = polls, scrapes
    print(f"{name}: {res['state']} in {res['wall_s']} s ({res.get('reason')}); "
          f"{res['device']} ({res['backend']}), val_accuracy {res['val_accuracy']}", flush=True)
    return res


def trainer_checks(check, res, prefix, dry_run):
    ok = res.get("state") == "SUCCEEDED" and res.get("watch_rc") == 0
    check.add(f"{prefix}.succeeded", ok,
              {"state": res.get("state"), "watch_rc": res.get("watch_rc"),
               "reason": res.get("reason"), "wall_s": res.get("wall_s")})
    want = ("cpu", "gloo") if dry_run else ("cuda", "nccl")
    dev, backend = res.get("device") or "", res.get("backend")
    check.add(f"{prefix}.{want[1]}_on_{want[0]}",
              dev.split(":")[0] == want[0] and backend == want[1],
              f"{dev} ({backend})", "the trainer's 'rank 0/1 on DEVICE (BACKEND)' log line")
    m = res.get("rank0_metrics") or {}
    check.add(f"{prefix}.metrics", number(m.get("loss")) is not None and
              res.get("loss_seen_while_running", False),
              {"loss": number(m.get("loss")), "global_step": m.get("global_step"),
               "samples_per_s": number(m.get("samples_per_s")),
               "first_after_s": res.get("first_metrics_after_s")},
              "rank 0's loss in `ddpctl get -o json`, while running and after")
    return ok


def gpu_metric_checks(check, res, prefix, dry_run):
    seen = res.get("gpu_fields_max") or {}
    series = res.get("rank_series_max") or {}
    check.add(f"{prefix}.prometheus_rank_series", "ddp_rank_loss" in series,
              {k: series[k] for k in sorted(series) if not k.startswith("ddp_rank_gpu")},
              f"ddp_rank_* at the coordinator's /metrics ({res.get('scrapes')} scrapes)")
    peak = seen.get("gpu_memory_peak_mib")
    check.add(f"{prefix}.gpu_memory_metrics", None if dry_run else bool(peak and peak > 0),
              seen, "max over the run of `ddpctl get -o json`'s per-rank metrics and ranks" +
              ("; a dry run records them" if dry_run else "; peak must be > 0"))
    gpu_series = {k: series.get(k) for k in GPU_SERIES}
    check.add(f"{prefix}.gpu_prometheus_series",
              None if dry_run else all(v is not None for v in gpu_series.values()),
              gpu_series, "max over the run" + ("; a dry run records them" if dry_run else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="ddp-coordinator, ddp-worker, ddpctl")
    ap.add_argument("--trainer", required=True, help="the ddp-trainer the worker runs")
    ap.add_argument("--data", required=True, help="Fashion-MNIST's four IDX .gz files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctl-lib", default="", help="LD_LIBRARY_PATH of the control plane")
    ap.add_argument("--trainer-lib", default="",
                    help="LD_LIBRARY_PATH entries the worker's trainers need (before --ctl-lib)")
    ap.add_argument("--python", default=sys.executable, help="the command job's Python (torch)")
    ap.add_argument("--job-timeout", type=int, default=0,
                    help="seconds a job may take, submit to end (0: 150; 300 in a dry run, "
                         "where bf16 on a CPU shared with the other checks is slow)")
    ap.add_argument("--budget", type=int, default=0,
                    help="seconds for all of it: a job that would start past it is not run "
                         "(0: 360; 720 in a dry run)")
    ap.add_argument("--dry-run", action="store_true", help="a CPU machine: Gloo, a few steps")
    a = ap.parse_args()
    a.bin, a.trainer, a.data, a.out = (os.path.abspath(p) for p in (a.bin, a.trainer, a.data, a.out))
    a.ctl_lib = os.path.abspath(a.ctl_lib) if a.ctl_lib else ""
    job_timeout = a.job_timeout or (300 if a.dry_run else 150)
    a.budget = a.budget or (720 if a.dry_run else 360)
    logs = os.path.join(a.out, "stack")
    os.makedirs(logs, exist_ok=True)
    check = Check()
    result = {"dry_run": a.dry_run, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "bin": a.bin, "trainer": a.trainer, "ctl_lib": a.ctl_lib,
              "trainer_lib": a.trainer_lib, "jobs": {}}
    # SIGTERM (a timeout around us) unwinds as an exit does, through the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    tmp = tempfile.mkdtemp(prefix="ddp-gpu-stack-")
    stack = Stack(a, tmp, logs)
    t0 = time.time()
    interrupted = None

    def timeout():
        left = a.budget - (time.time() - t0)
        if left < 20:
            raise RuntimeError(f"out of time: {a.budget} s (--budget) spent")
        return min(job_timeout, left)

    try:
        missing = [p for p in [os.path.join(a.bin, b) for b in ("ddp-coordinator", "ddp-worker",
                                                                "ddpctl")] + [a.trainer]
                   if not os.access(p, os.X_OK)]
        missing += [f for f in FMNIST if not os.path.isfile(os.path.join(a.data, f))]
        if missing:
            raise RuntimeError(f"missing: {', '.join(missing)}")
        result["versions"] = {
            b: subprocess.run([stack.bin(b), "--version"], env=stack.ctl_env, capture_output=True,
                              text=True).stdout.strip() for b in ("ddp-coordinator", "ddpctl")}
        worker = stack.up()
        print(f"stack up in {time.time() - t0:.1f} s: coordinator {stack.address}, "
              f"metrics :{stack.metrics_port}, worker gpu0", flush=True)
        gpus = [{k: g.get(k) for k in ("index", "uuid", "model", "memory_bytes")}
                for g in worker.get("gpu_devices", [])]
        result["worker"] = {k: worker.get(k) for k in ("name", "slots", "gpus", "version")}
        result["worker"]["gpu_devices"] = gpus
        check.add("worker.registered", True, result["worker"] | {"gpu_devices": len(gpus)})
        nvml = any(GPU_NAME.search(g.get("model") or "") for g in gpus)
        check.add("worker.nvml_gpu", None if a.dry_run else nvml,
                  [g.get("model") for g in gpus],
                  "the GPUs the worker registered (NVML)" + ("; none on a CPU" if a.dry_run else ""))

        jobs = result["jobs"]

        def fp32_job():
            fp32 = jobs["fmnist-fp32"] = run_job(
                stack, "fmnist-fp32", fmnist_job("fmnist-fp32", a.data, a.dry_run), timeout())
            trainer_checks(check, fp32, "fp32", a.dry_run)
            acc = fp32.get("val_accuracy")
            check.add("fp32.val_accuracy",
                      None if a.dry_run else bool(acc and acc >= MIN_ACCURACY),
                      {"last": acc, "epochs": fp32.get("epochs")},
                      f"last epoch >= {MIN_ACCURACY}" + ("; a dry run stops after 120 steps"
                                                         if a.dry_run else ""))
            gpu_metric_checks(check, fp32, "fp32", a.dry_run)

        def bf16_job():
            bf16 = jobs["fmnist-bf16"] = run_job(
                stack, "fmnist-bf16", fmnist_job("fmnist-bf16", a.data, a.dry_run, "bf16"),
                timeout())
            if not bf16["submitted"]:
                err = bf16.get("submit_error", "")
                refused = "precision" in err
                note = ("these binaries do not take train.precision bf16 yet: job skipped"
                        if refused else "submit failed")
                check.add("bf16.submitted", None if (a.dry_run and refused) else False, err, note)
                return
            trainer_checks(check, bf16, "bf16", a.dry_run)
            acc = (jobs.get("fmnist-fp32") or {}).get("val_accuracy")
            acc16 = bf16.get("val_accuracy")
            delta = abs(acc16 - acc) if acc16 is not None and acc is not None else None
            check.add("bf16.accuracy_vs_fp32",
                      None if a.dry_run else bool(delta is not None and delta <= MAX_BF16_DELTA),
                      {"bf16": acc16, "fp32": acc,
                       "delta": round(delta, 4) if delta is not None else None},
                      f"|bf16 - fp32| <= {MAX_BF16_DELTA}")

        def script_job_checks():
            script = jobs["torch-script"] = run_job(
                stack, "torch-script", script_job(a.python, a.ctl_lib), timeout())
            ok = script.get("state") == "SUCCEEDED" and script.get("watch_rc") == 0
            check.add("script.succeeded", ok, {"state": script.get("state"),
                                               "watch_rc": script.get("watch_rc"),
                                               "reason": script.get("reason"),
                                               "wall_s": script.get("wall_s")})
            m = script.get("rank0_metrics") or {}
            check.add("script.metrics", number(m.get("loss")) is not None,
                      {"loss": number(m.get("loss")), "global_step": m.get("global_step"),
                       "samples_per_s": number(m.get("samples_per_s"))},
                      "the step lines of DDP_EVENTS_FD in `ddpctl get -o json`")
            name = script.get("device_name")
            check.add("script.device_in_logs",
                      name == "cpu" if a.dry_run else bool(name and GPU_NAME.search(name)),
                      {"device": name, "backend": script.get("backend"),
                       "gpu_uuid": [r.get("gpu_uuid") for r in script.get("ranks", [])]},
                      "torch_job.py's 'device: NAME' in `ddpctl logs`")

        for name, run in (("fp32", fp32_job), ("bf16", bf16_job), ("script", script_job_checks)):
            try:  # One job's trouble leaves the others their turn.
                run()
            except Exception as e:  # noqa: BLE001: every failure becomes a failed check
                check.add(f"{name}.error", False, f"{type(e).__name__}: {e}")
    except SystemExit as e:  # SIGTERM: what was seen is still written
        interrupted = e.code
        check.add("stack.interrupted", False, "SIGTERM")
    except Exception as e:  # noqa: BLE001: every failure becomes a failed check
        check.add("stack.error", False, f"{type(e).__name__}: {e}")
    finally:
        stack.down()
        shutil.rmtree(tmp, ignore_errors=True)
    result["wall_s"] = round(time.time() - t0, 1)
    result["checks"] = check.rows
    result["failed"] = check.failed()
    write(a.out, result)
    bad = result["failed"]
    print(f"stack.py: {len(check.rows)} checks, {len(bad)} failed"
          + (f": {', '.join(bad)}" if bad else "") + f"; {result['wall_s']} s; "
          f"{os.path.join(a.out, 'stack.json')}", flush=True)
    return interrupted or (1 if bad else 0)


def dash(v):
    return "-" if v is None else f"{v:g}"


def write(out, result):
    with open(os.path.join(out, "stack.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")
    gpus = ", ".join(g.get("model") or "?" for g in result.get("worker", {}).get("gpu_devices", []))
    lines = [f"Full stack: ddp-coordinator, one ddp-worker ({gpus or 'no GPU'}), ddpctl; "
             f"{result['machine']}" + ("; DRY RUN on the CPU: Gloo, 120 steps, the accuracy "
                                       "and GPU checks recorded only" if result["dry_run"] else ""),
             "", "| job | state | device (backend) | epochs | val_accuracy | wall s | "
             "peak GPU MiB | GPU util % |", "|---|---|---|---|---|---|---|---|"]
    for name, j in result["jobs"].items():
        if not j.get("submitted"):
            lines.append(f"| {name} | not submitted | | | | | | |")
            continue
        g = j.get("gpu_fields_max") or {}
        acc = j.get("val_accuracy")
        device = j.get("device_name") if name == "torch-script" else j.get("device")
        lines.append(f"| {name} | {j.get('state')} | {device} ({j.get('backend') or '-'}) | "
                     f"{len(j.get('epochs') or [])} | "
                     f"{'-' if acc is None else f'{acc:.4f}'} | {j.get('wall_s')} | "
                     f"{dash(g.get('gpu_memory_peak_mib'))} | {dash(g.get('gpu_utilization_pct'))} |")
    lines += ["", "| check | result | value |", "|---|---|---|"]
    for r in result["checks"]:
        v = json.dumps(r["value"], default=str).replace("|", "\\|")
        if len(v) > 120:
            v = v[:117] + "..."
        lines.append(f"| {r['name']} | {({True: 'pass', False: '**FAIL**', None: 'recorded'})[r['passed']]}"
                     f" | `{v}` |")
    with open(os.path.join(out, "stack.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
