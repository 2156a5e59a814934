#!/usr/bin/env python3
"""Coordinator takeover: how long a job's control plane is gone when its leader goes.

One real PostgreSQL 15 server (initdb + pg_ctl in a scratch directory on a free loopback
port, as `nobody` when run as root, the settings of tests/common/postgres_server.cc), two
ddp-coordinators A and B on it (`--store`; the timing flags of the integration tests:
--rpc-deadline=100ms --heartbeat-interval=200ms --heartbeat-timeout=5s), two ddp-workers
given both addresses, and one 2-node job (the real ddp-trainer: an MLP 128x128 on
synthetic data, more epochs than the run needs) that trains through every repeat.

Each takeover: find the leader (the coordinator that answers `ddpctl get JOB` on its own
address; a standby answers "not the leader"), signal it, and measure from the signal:

  ddpctl       the first `ddpctl get JOB --coordinator A,B` that succeeds (one call
               after another, 50 ms apart; the time the successful call returned)
  heartbeats   both workers' heartbeats accepted by the new leader: when each worker's
               stderr shows "coordinator reachable again after ..." (read as it is
               written; the time is the line's own timestamp) for the first time since
               the new leader serves, the later of the two. (A leader stopping on
               SIGTERM may still answer heartbeats on open connections while it shuts
               down: those lines come before the new leader serves and are counted
               apart, reachable_before_new_leader; a worker whose heartbeats went from
               the old leader to the new one without one failing logs no line, and its
               figure is then the coordinator's.)
               Cross-checked with the coordinator's record: `ddpctl workers -o json`
               polled every 50 ms from the signal on, each worker's first
               last_heartbeat_ms at or after the new leader's "leading on" line.
  lease        the new leader's "leading: took the lease with epoch N" line
  rebuild      the new leader's own "X after taking the lease" figure: the state
               loaded from the store and the server started
  released     (SIGTERM) the old leader's "released the lease" line

then start the old leader again (same port, same flags: the next repeat's standby),
wait --settle seconds and check that the job is still RUNNING in its first attempt with
0 restarts (if not, the row says why, with any worker's "fencing its ranks" line, and a
fresh job is submitted for the takeovers left). Each signal comes a random part of
--lease-renew after the standby is up, so that it falls anywhere in the standby's cycle
of tries.

Variants, interleaved (one of each per repeat):
  kill9   kill -9 of the leader: the standby waits for the lease to lapse (up to about
          --lease-ttl + --lease-renew)
  sigterm SIGTERM: the leader stops serving and releases the lease; the standby takes
          it at its next try (up to about --lease-renew)

Usage: /usr/bin/python3 bench/takeover.py [--repeats 5] [--lease-ttl 3s] [--lease-renew 1s]
(results: bench/results/takeover.json)
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import pwd
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchkit import free_port  # noqa: E402  (bench/benchkit.py: the tests' ports)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(HERE, "build", "bin")  # main() points it at a snapshot of --bin
PROGRAMS = ("ddp-coordinator", "ddp-worker", "ddpctl", "ddp-trainer")
PG_BIN = os.environ.get("DDP_POSTGRES_BIN_DIR", "/usr/lib/postgresql/15/bin")
TIMING = ["--rpc-deadline=100ms", "--heartbeat-interval=200ms", "--heartbeat-timeout=5s"]
VARIANTS = ("kill9", "sigterm")
SIGNALS = {"kill9": signal.SIGKILL, "sigterm": signal.SIGTERM}

JOB = """name: takeover
nodes: 2
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: %d, batch_size: 32, threads: 1}
metrics: {every_steps: 20}
"""

TOOK = re.compile(r"leading: took the lease with epoch (\d+)")
LEADING = re.compile(r"leading on \S+ \(epoch (\d+)\), (\S+) after taking the lease")
REACHABLE = re.compile(r"coordinator reachable again after (\S+)")
UNREACHABLE = re.compile(r"coordinator unreachable: |cannot register with the coordinator|"
                         r"the coordinator does not know this worker")
STANDBY = "standby: this coordinator is a standby"
# Warnings every outage brings (and the workers' two about their own flags): not listed.
EXPECTED = re.compile(r"--allow-root|--allow-exec|coordinator unreachable: |cannot report output "
                      r"to the coordinator|a coordinator outage; ranks keep running|cannot "
                      r"register with the coordinator")


def duration_s(text):
    """absl::FormatDuration's text ("1.5s", "12.3ms", "1m2s", "850us", "0") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(h|ms|us|ns|m|s)", text)
    if not parts and text.strip("-") != "0":
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(v) * units[u] for v, u in parts)


GLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)")


def log_time_ms(line):
    """The time a glog line ("I1126 03:14:55.063659 ...") was written, in ms since the epoch."""
    m = GLOG.match(line)
    month, day, hh, mm, ss, frac = m.groups()
    t = datetime.datetime(datetime.date.today().year, int(month), int(day), int(hh), int(mm),
                          int(ss), int(frac.ljust(6, "0")[:6]))
    return t.timestamp() * 1000


def wait(pred, timeout, every=0.05, what="a condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


class Daemon:
    """A process in its own process group whose stderr (and stdout) is read line by line
    as it is written: each line is kept with the monotonic time it was read and copied to
    a log file."""

    def __init__(self, argv, log_path):
        self.argv = argv
        self.lines = []  # (monotonic, line)
        self.cond = threading.Condition()
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()
        self.eof_at = None  # When its output closed: about when it exited.
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            t = time.monotonic()
            line = raw.decode(errors="replace").rstrip("\n")
            with self.cond:
                self.lines.append((t, line))
                self.cond.notify_all()
            self.log.write(line + "\n")
            self.log.flush()
        self.eof_at = time.monotonic()

    def find(self, pattern, since, timeout):
        """The first line at or after `since` that matches `pattern` (a compiled regex or a
        substring): (time, match or line). Raises TimeoutError."""
        def match(line):
            return pattern.search(line) if hasattr(pattern, "search") else \
                (line if pattern in line else None)
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for t, line in self.lines:
                    if t >= since:
                        m = match(line)
                        if m:
                            return t, m
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line matching {getattr(pattern, 'pattern', pattern)!r} "
                                       f"from {os.path.basename(self.argv[0])}")
                self.cond.wait(min(left, 0.5))

    def logged(self, pattern, from_ms, timeout):
        """The first line written (by its own glog timestamp) at or after `from_ms` that
        matches the regex `pattern`: (ms, match). Raises TimeoutError."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for _, line in self.lines:
                    m = pattern.search(line)
                    if m and GLOG.match(line) and log_time_ms(line) >= from_ms:
                        return log_time_ms(line), m
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line matching {pattern.pattern!r} from "
                                       f"{os.path.basename(self.argv[0])}")
                self.cond.wait(min(left, 0.5))

    def matching(self, pattern, from_ms, to_ms=float("inf")):
        """Its lines written in [from_ms, to_ms) that contain `pattern` (a regex or text)."""
        with self.cond:
            return [line for _, line in self.lines if GLOG.match(line) and
                    from_ms <= log_time_ms(line) < to_ms and
                    (pattern.search(line) if hasattr(pattern, "search") else pattern in line)]

    def cut_off_at(self, ms):
        """A worker: whether its last word before `ms` was that its heartbeats fail (the
        first failure after a success is always logged)."""
        state = False
        with self.cond:
            for _, line in self.lines:
                if not GLOG.match(line) or log_time_ms(line) >= ms:
                    continue
                if REACHABLE.search(line):
                    state = False
                elif UNREACHABLE.search(line):
                    state = True
        return state

    def warnings(self):
        """Its warning and error lines, less the workers' two about their own flags."""
        with self.cond:
            return [line for _, line in self.lines
                    if re.match(r"^[WEF]\d{4}", line) and not EXPECTED.search(line)]

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout=15):
        """SIGTERM, then SIGKILL to the whole process group."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.reader.join(timeout=2)
        self.log.close()


class HeartbeatPoller:
    """`ddpctl workers -o json` (given both addresses) one call after another, 50 ms apart,
    from its start until stop(): every worker's last_heartbeat_ms as whichever coordinator
    led at the time answered."""

    def __init__(self, bench):
        self.bench = bench
        self.samples = []  # {worker: last_heartbeat_ms}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            try:
                r = self.bench.ctl("workers", "-o", "json", check=False, timeout=10)
                if r.returncode == 0:
                    d = json.loads(r.stdout)
                    ws = d.get("workers", []) if isinstance(d, dict) else d
                    self.samples.append({w["name"]: int(w.get("last_heartbeat_ms", 0))
                                         for w in ws})
            except (subprocess.TimeoutExpired, ValueError, KeyError):
                pass
            self.done.wait(0.05)

    def first_after(self, worker, ms):
        """The earliest heartbeat of `worker` at or after `ms` seen, or None."""
        got = [s[worker] for s in list(self.samples) if s.get(worker, 0) >= ms]
        return min(got) if got else None

    def stop(self):
        self.done.set()
        self.thread.join(timeout=15)


class Postgres:
    """PostgreSQL 15 in a scratch directory, as tests/common/postgres_server.cc starts it."""

    def __init__(self, taken):
        self.root = tempfile.mkdtemp(prefix="ddp-takeover-pg-")
        self.data = os.path.join(self.root, "data")
        self.port = None
        self.prefix = []
        self.env = {"PATH": "/usr/bin:/bin", "HOME": self.root, "LC_ALL": "C", "LANG": "C",
                    "PGCONNECT_TIMEOUT": "10"}
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root.
            nobody = pwd.getpwnam("nobody")
            os.chown(self.root, nobody.pw_uid, nobody.pw_gid)
            self.prefix = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                           "--clear-groups", "--"]
        try:  # Whatever fails from here on, nothing is left behind.
            self.run("initdb", "-D", self.data, "-U", "ddp", "--auth=trust", "-E", "UTF8",
                     "--locale=C", "--no-sync")
            with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
                f.write("\n# bench/takeover.py: small and fast, loopback only\n"
                        "listen_addresses = '127.0.0.1'\n"
                        f"unix_socket_directories = '{self.root}'\n"
                        "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                        "shared_buffers = 16MB\nmax_connections = 50\n"
                        # Under the data dir, not /dev/shm (a killed server leaves those).
                        "dynamic_shared_memory_type = mmap\n")
            for attempt in range(3):
                self.port = free_port(taken)
                try:
                    self.run("pg_ctl", "start", "-D", self.data, "-l",
                             os.path.join(self.root, "postgres.log"), "-w", "-t", "60",
                             "-o", f"-p {self.port}", timeout=90)
                    break
                except RuntimeError as e:
                    if attempt == 2 or "already in use" not in self.log_tail():
                        raise e
            self.run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "ddp", "-w",
                     "--", "ddp")
        except BaseException:
            self.close()
            raise

    def uri(self):
        return f"postgresql://ddp@127.0.0.1:{self.port}/ddp"

    def run(self, program, *args, timeout=120):
        r = subprocess.run(self.prefix + [os.path.join(PG_BIN, program), *args], cwd=self.root,
                           env=self.env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{program} failed (exit {r.returncode}): {r.stderr.strip()} "
                               f"{r.stdout.strip()}\n{self.log_tail()}")
        return r.stdout

    def log_tail(self, lines=20):
        try:
            with open(os.path.join(self.root, "postgres.log")) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def postmaster_pid(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return 0

    def close(self):
        pid = self.postmaster_pid()
        if pid > 0:
            try:
                self.run("pg_ctl", "stop", "-D", self.data, "-m", "fast", "-w", "-t", "30",
                         timeout=60)
            except Exception:  # noqa: BLE001 (cleanup goes on)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.root, ignore_errors=True)


class Bench:
    def __init__(self, args, taken):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="ddp-takeover-")
        self.taken = taken
        self.pg = None
        self.coordinators = {}  # "A"/"B" -> Daemon
        self.ports = {}
        self.workers = {}
        self.restarts = {"A": 0, "B": 0}
        self.job_id = None
        self.job_ids = []
        self.trainer_pids = []
        self.daemons = []  # (label, Daemon): every process started, for the logs' warnings
        self.poller = None

    def start(self):
        self.pg = Postgres(self.taken)
        for name in ("A", "B"):
            self.ports[name] = free_port(self.taken)
        self.addresses = ",".join(f"127.0.0.1:{self.ports[n]}" for n in ("A", "B"))
        for name in ("A", "B"):
            self.start_coordinator(name)
        for name in ("w1", "w2"):
            os.makedirs(os.path.join(self.dir, name))
            self.workers[name] = Daemon(
                [os.path.join(BIN, "ddp-worker"), "--coordinator", self.addresses, "--name",
                 name, "--slots", "1", "--cpus", "1", "--stop-grace", "3s", "--work-dir",
                 os.path.join(self.dir, name), "--health-listen",
                 f"127.0.0.1:{free_port(self.taken)}"],
                os.path.join(self.dir, f"{name}.log"))
            self.daemons.append((name, self.workers[name]))

        def workers_up():
            r = self.ctl("workers", "-o", "json", check=False)
            return r.returncode == 0 and r.stdout.count('"name"') >= 2
        wait(workers_up, 60, 0.2, "both workers to register")
        self.submit()

    def submit(self):
        """Submits the job and waits until both ranks have stepped."""
        spec = os.path.join(self.dir, "job.yaml")
        with open(spec, "w") as f:
            f.write(JOB % self.args.epochs)
        self.job_id = self.ctl("submit", spec).stdout.strip()
        self.job_ids.append(self.job_id)

        def stepped():
            j = self.job()
            ms = j.get("metrics", [])
            return j if j.get("state") == "RUNNING" and len(ms) == 2 and \
                min(int(m.get("global_step", 0)) for m in ms) > 40 else None
        j = wait(stepped, 120, 0.2, "the job to run on both ranks")
        self.trainer_pids += [int(r["pid"]) for r in j["attempts"][0]["ranks"] if r.get("pid")]

    def start_coordinator(self, name):
        if name in self.coordinators:
            self.coordinators[name].stop()
        log = os.path.join(self.dir, f"coordinator-{name}.log")
        self.coordinators[name] = d = Daemon(
            [os.path.join(BIN, "ddp-coordinator"), "--listen", f"127.0.0.1:{self.ports[name]}",
             "--store", self.pg.uri(), "--store-wait=20s", *TIMING,
             f"--lease-ttl={self.args.lease_ttl}", f"--lease-renew={self.args.lease_renew}"],
            log)
        self.daemons.append((f"coordinator {name} #{self.restarts[name] + 1}", d))

    def ctl(self, *args, coordinator=None, check=True, timeout=30):
        r = subprocess.run([os.path.join(BIN, "ddpctl"), *args, "--coordinator",
                            coordinator or self.addresses],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"ddpctl {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def job(self):
        return json.loads(self.ctl("get", self.job_id, "-o", "json").stdout)

    def leader(self):
        """The one coordinator that answers `ddpctl get JOB` on its own address."""
        def one():
            leads = [n for n, d in self.coordinators.items() if d.alive() and self.ctl(
                "get", self.job_id, coordinator=f"127.0.0.1:{self.ports[n]}",
                check=False).returncode == 0]
            return leads[0] if len(leads) == 1 else None
        return wait(one, 60, 0.1, "exactly one leader")

    def takeover(self, variant, repeat):
        old = self.leader()
        new = "B" if old == "A" else "A"
        d_old, d_new = self.coordinators[old], self.coordinators[new]
        # The standby knows who leads. A random wait on top of --settle: the signal then
        # falls anywhere in the standby's cycle of tries (--lease-renew), not always at
        # the same point of it.
        d_new.find(STANDBY, d_new.started, 30)
        time.sleep(random.uniform(0, duration_s(self.args.lease_renew)))
        load = os.getloadavg()[0]
        t0, w0 = time.monotonic(), time.time()
        d_old.signal(SIGNALS[variant])
        poller = self.poller = HeartbeatPoller(self)

        # (a) ddpctl given both addresses: one call after another, 50 ms apart.
        tries = 0
        while True:
            tries += 1
            r = self.ctl("get", self.job_id, check=False, timeout=30)
            t_ctl = time.monotonic()
            if r.returncode == 0:
                break
            if t_ctl - t0 > 120:
                raise TimeoutError(f"ddpctl get failed for 120 s: {r.stderr.strip()}")
            time.sleep(0.05)
        # (c) The new leader's lease and its state rebuild. Times from here on are the
        # lines' own timestamps (when they were written: under load the reader of a
        # process's output can lag by tens of milliseconds).
        _, took = d_new.find(TOOK, t0, 60)
        _, leading = d_new.find(LEADING, t0, 60)
        took_ms, serving_ms = log_time_ms(took.string), log_time_ms(leading.string)
        epoch = int(leading.group(1))
        # (b) Both workers' heartbeats accepted by the new leader: the first "reachable
        # again" once it serves. Earlier ones after a SIGTERM are heartbeats the old
        # leader still answered while it shut down: counted apart. A worker that was
        # not cut off when the new leader came (its heartbeats went from the old leader
        # to the new one without one failing) logs none: for it the figure is the
        # coordinator's record of its first heartbeat.
        seen = {}
        for name, w in self.workers.items():
            row = {"reachable_before_new_leader":
                   len(w.matching(REACHABLE, w0 * 1000, serving_ms))}
            try:
                ms, m = w.logged(REACHABLE, serving_ms, 120 if w.cut_off_at(serving_ms) else 3)
                row.update(at_s=round(ms / 1000 - w0, 3), worker_says_s=duration_s(m.group(1)),
                           source="log")
            except TimeoutError:
                row.update(at_s=None, source="coordinator")
            seen[name] = row
        wait(lambda: all(poller.first_after(n, serving_ms) for n in self.workers), 30, 0.05,
             "both workers' heartbeats in the new leader's record")
        poller.stop()
        for name, row in seen.items():
            row["coordinator_s"] = round(poller.first_after(name, serving_ms) / 1000 - w0, 3)
            if row["at_s"] is None:
                row["at_s"] = row["coordinator_s"]

        # The old leader back, as the next standby.
        d_old.proc.wait(timeout=30)
        d_old.reader.join(timeout=5)
        stop_s = round(d_old.eof_at - t0, 3) if d_old.eof_at else None
        released = d_old.matching("released the lease", w0 * 1000)
        old_exit = d_old.proc.returncode
        self.restarts[old] += 1
        self.start_coordinator(old)
        self.coordinators[old].find(STANDBY, self.coordinators[old].started, 60)
        # Then a while for the job to show what the takeover did to it (a rank killed
        # in the outage is reported once its worker reaches the new leader).
        time.sleep(self.args.settle)
        fenced = {name: w.matching("fencing its ranks", w0 * 1000)
                  for name, w in self.workers.items()}
        fenced = {k: v for k, v in fenced.items() if v}

        j = self.job()
        ok = j.get("state") == "RUNNING" and int(j.get("restarts", 0)) == 0 and \
            len(j.get("attempts", [])) == 1
        row = {"variant": variant, "repeat": repeat, "killed": old, "new_leader": new,
               "epoch": epoch, "load_avg_1m": round(load, 2),
               "ddpctl_s": round(t_ctl - t0, 3), "ddpctl_calls": tries,
               "heartbeats_s": max(s["at_s"] for s in seen.values()),
               "heartbeats_coordinator_s": max(s["coordinator_s"] for s in seen.values()),
               "workers": seen,
               "lease_taken_s": round(took_ms / 1000 - w0, 3),
               "serving_s": round(serving_ms / 1000 - w0, 3),
               "rebuild_s": round(duration_s(leading.group(2)), 6),
               "old_leader_exit": old_exit,
               "old_leader_released_lease_s":
                   round(log_time_ms(released[0]) / 1000 - w0, 3) if released else None,
               "old_leader_exited_s": stop_s,
               "job": self.job_id, "job_state": j.get("state"),
               "job_restarts": int(j.get("restarts", 0)),
               "job_attempts": len(j.get("attempts", [])), "job_ok": ok}
        if fenced:
            row["fenced"] = fenced
        if not ok:
            row["job_reason"] = j.get("reason", "")
            # The next takeovers need a running job: a fresh one.
            self.submit()
            row["resubmitted_as"] = self.job_id
        if int(took.group(1)) != epoch:
            row["note"] = f"took epoch {took.group(1)} but leads with {epoch}"
        return row

    def close(self):
        if self.poller:
            self.poller.stop()
        for job_id in self.job_ids:
            try:
                self.ctl("cancel", job_id, check=False, timeout=60)
            except Exception:  # noqa: BLE001
                pass
        for w in self.workers.values():  # Agents stop their trainers first.
            w.stop(timeout=15)
        for pid in self.trainer_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for c in self.coordinators.values():
            c.signal(signal.SIGCONT)
            c.stop(timeout=10)
        if self.pg:
            self.pg.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def warnings(self):
        out = {}
        for label, d in self.daemons:
            w = d.warnings()
            if w:
                out[label] = w[-100:]
        return out


def stats(values):
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="takeovers of each variant")
    p.add_argument("--lease-ttl", default="3s", help="ddp-coordinator --lease-ttl")
    p.add_argument("--lease-renew", default="1s", help="ddp-coordinator --lease-renew")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds after the old leader is back before the job is checked and "
                        "the next takeover starts (plus a random part of --lease-renew)")
    p.add_argument("--epochs", type=int, default=10000,
                   help="the job's epochs (it is cancelled at the end)")
    p.add_argument("--bin", default=os.path.join(HERE, "build", "bin"),
                   help="where ddp-coordinator, ddp-worker, ddpctl and ddp-trainer are; they "
                        "are copied at the start, so a build meanwhile changes nothing")
    p.add_argument("--out", default=os.path.join(HERE, "bench", "results", "takeover.json"))
    p.add_argument("--keep-logs", help="copy the daemons' logs to this directory")
    args = p.parse_args()
    for b in PROGRAMS:
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            sys.exit(f"{args.bin}/{b} is missing: build the project first")

    # SIGTERM to this script cleans up as Ctrl-C does.
    def interrupted(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    load_before = os.getloadavg()
    runs = []
    bench = Bench(args, set())
    warnings = {}
    build = {}
    try:
        global BIN
        BIN = os.path.join(bench.dir, "bin")
        os.makedirs(BIN)
        for b in PROGRAMS:
            src = os.path.join(args.bin, b)
            shutil.copy2(src, BIN)
            with open(src, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:16]
            build[b] = {"mtime": time.strftime("%Y-%m-%d %H:%M:%S",
                                               time.localtime(os.path.getmtime(src))),
                        "sha256": digest}
        build["uncommitted_changes"] = subprocess.run(
            ["git", "-C", HERE, "status", "--short", "--untracked-files=no"],
            capture_output=True, text=True).stdout.split("\n")[:-1]
        bench.start()
        for i in range(args.repeats):
            for variant in VARIANTS if i % 2 == 0 else reversed(VARIANTS):
                r = bench.takeover(variant, i + 1)
                runs.append(r)
                released = r["old_leader_released_lease_s"]
                early = sum(w["reachable_before_new_leader"] for w in r["workers"].values())
                print(f"{variant:8s} #{i + 1}: {r['killed']} -> {r['new_leader']} (epoch "
                      f"{r['epoch']}): ddpctl {r['ddpctl_s']:.3f} s, heartbeats "
                      f"{r['heartbeats_s']:.3f} s (coordinator's record "
                      f"{r['heartbeats_coordinator_s']:.3f} s), lease "
                      f"{r['lease_taken_s']:.3f} s, rebuild {r['rebuild_s'] * 1000:.1f} ms"
                      + (f"; old leader released the lease at {released:.3f} s"
                         if released is not None else "")
                      + (f"; {early} heartbeat(s) answered before the new leader served"
                         if early else "")
                      + (f"; FENCED: {r['fenced']}" if r.get("fenced") else "")
                      + f"; job {r['job_state']}, restarts {r['job_restarts']}"
                      + (f" ({r['job_reason']}; resubmitted)" if not r["job_ok"] else ""),
                      flush=True)
        final = bench.job()
    finally:
        # Cleanup runs to its end whatever comes now (Ctrl-C again, or a SIGTERM sent to
        # the whole process group as `timeout` does); each step has its own timeout.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        warnings = bench.warnings()
        if args.keep_logs:
            shutil.copytree(bench.dir, args.keep_logs, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("w1", "w2", "bin"))
        bench.close()

    summary = {}
    for v in VARIANTS:
        rs = [r for r in runs if r["variant"] == v]
        summary[v] = {k: stats([r[k] for r in rs])
                      for k in ("ddpctl_s", "heartbeats_s", "heartbeats_coordinator_s",
                                "lease_taken_s", "serving_s", "rebuild_s")}
        released = [r["old_leader_released_lease_s"] for r in rs
                    if r["old_leader_released_lease_s"] is not None]
        if released:
            summary[v]["old_leader_released_lease_s"] = stats(released)
        summary[v]["runs"] = len(rs)
        summary[v]["job_failed"] = sum(not r["job_ok"] for r in rs)
        summary[v]["fenced"] = sum(bool(r.get("fenced")) for r in rs)
        summary[v]["heartbeats_answered_before_new_leader"] = sum(
            w["reachable_before_new_leader"] for r in rs for w in r["workers"].values())
    result = {"machine": f"{platform.node()} ({os.cpu_count()} cores), {platform.platform()}",
              "commit": commit, "date": time.strftime("%Y-%m-%d"),
              "lease_ttl": args.lease_ttl, "lease_renew": args.lease_renew,
              "coordinator_flags": TIMING, "repeats": args.repeats, "build": build,
              "load_avg_before": [round(x, 2) for x in load_before],
              "load_avg_after": [round(x, 2) for x in os.getloadavg()],
              "job_at_end": {"state": final.get("state"),
                             "restarts": int(final.get("restarts", 0)),
                             "attempts": len(final.get("attempts", []))},
              "summary": summary, "runs": runs, "log_warnings": warnings}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)

    def cell(s, scale=1.0, fmt="{:.2f}"):
        return f"{fmt.format(s['median'] * scale)} ({fmt.format(s['min'] * scale)}-" \
               f"{fmt.format(s['max'] * scale)})"
    print(f"\nlease ttl {args.lease_ttl}, renew {args.lease_renew}; median (min-max) of "
          f"{args.repeats}, seconds from the signal")
    print(f"{'variant':8s} | {'ddpctl get':18s} | {'heartbeats':18s} | {'lease taken':18s} | "
          f"{'rebuild, ms':16s} | {'lease released':18s} | job failed")
    for v in VARIANTS:
        s = summary[v]
        rel = cell(s["old_leader_released_lease_s"]) if "old_leader_released_lease_s" in s \
            else "-"
        print(f"{v:8s} | {cell(s['ddpctl_s']):18s} | {cell(s['heartbeats_s']):18s} | "
              f"{cell(s['lease_taken_s']):18s} | {cell(s['rebuild_s'], 1000, '{:.1f}'):16s} | "
              f"{rel:18s} | {s['job_failed']} of {s['runs']}")
    print(f"job at the end: {result['job_at_end']}; results in {args.out}")
    if warnings:
        print(f"warnings/errors in the logs of: {', '.join(sorted(warnings))} (see log_warnings)")


if __name__ == "__main__":
    main()
