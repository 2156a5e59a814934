#!/usr/bin/python3
"""deploy/slurm/ddp-workers.sbatch against a real single-node Slurm.

Starts munged, slurmctld and slurmd (Debian's packages) in a scratch directory, with
their own key, socket, ports and spool, so nothing of the host's is used or touched,
and a ddp-coordinator (loopback) with one worker outside Slurm. Then:
  1. sbatch of the script with 2 tasks on the one node brings up 2 workers labelled
     slurm_job=<job id>;
  2. a 2-node job with node_selector {slurm_job: <id>} SUCCEEDS, and ran on them;
  3. with a job running on the worker outside Slurm, scancel takes the Slurm workers
     out of `ddpctl workers` at once (they leave; the coordinator's heartbeat timeout
     is 60 s here), and that job still SUCCEEDS, never restarted; a job selecting the
     ended allocation waits, its reason naming the selector.
Everything it started is stopped, and the directory removed, whatever happens.

Usage: slurm_test.py SOURCE_DIR BIN_DIR. Exits 77 (skipped) unless run as root with
the Slurm and MUNGE programs installed (scripts/install_deps.sh installs them).
"""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ddp_test_ports import claim_port  # noqa: E402

SKIP = 77
SLURM_PROGRAMS = ["mungekey", "munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo",
                  "scancel", "srun"]
HEARTBEAT_TIMEOUT_S = 60  # The coordinator's: a worker that merely vanished stays listed.
LEAVE_WITHIN_S = 15       # How soon after scancel the Slurm workers must be gone.
DEADLINE_S = 220          # The whole test, well inside ctest's TIMEOUT (300) with cleanup.


class Failure(Exception):
    pass


class Interrupted(Failure):  # The deadline, or a signal: nothing to add to it.
    pass


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def die_with_parent():
    # The daemons are this test's children: if ctest kills the test, they go too.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port():
    # Of this test's own: below the ephemeral range, as docs/deploy.md advises for
    # loopback servers, and claimed against tests run beside this one
    # (tests/common/ddp_test_ports.py).
    return claim_port()


def wait_for(what, predicate, timeout, interval=0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Cluster:
    def __init__(self, src, bindir):
        self.src = src
        self.bin = bindir
        self.tmp = tempfile.mkdtemp(prefix="ddp-slurm-test.")
        os.chmod(self.tmp, 0o755)  # munged wants every directory above its socket searchable.
        self.procs = []  # (name, Popen), in start order
        self.node = socket.gethostname().split(".")[0]
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "DDP_")):
                del self.env[k]  # Nothing of an enclosing allocation or ddp setup.
        self.env["SLURM_CONF"] = os.path.join(self.tmp, "slurm.conf")
        self.coordinator = None

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def spawn(self, name, argv, **kw):
        out = open(self.path("log", name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=kw.pop("env", self.env), preexec_fn=die_with_parent, **kw)
        out.close()
        self.procs.append((name, p))
        return p

    def run(self, argv, timeout=30, check=True, env=None):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env=env or self.env)
        if check and r.returncode != 0:
            raise Failure(f"{' '.join(argv)} exited {r.returncode}: {r.stdout}{r.stderr}")
        return r

    # --- Slurm ---------------------------------------------------------------------
    def start_slurm(self):
        for d in ("log", "munge", "state", "spool/" + self.node):
            os.makedirs(self.path(d), exist_ok=True)
        os.makedirs(self.path("run"), mode=0o755, exist_ok=True)
        os.chmod(self.path("munge"), 0o700)
        key = self.path("munge", "munge.key")
        self.munge_socket = self.path("run", "munge.sock")
        self.run(["mungekey", "--create", "--keyfile", key, "--bits", "1024"])
        self.spawn("munged", ["munged", "--foreground", "--key-file=" + key,
                              "--socket=" + self.munge_socket,
                              "--pid-file=" + self.path("run", "munged.pid"),
                              "--log-file=" + self.path("log", "munged.log"),
                              "--seed-file=" + self.path("munge", "munged.seed")])
        wait_for("munged's socket", lambda: os.path.exists(self.munge_socket), 10)

        cpus = os.cpu_count() or 1
        ctld_port, slurmd_port = free_port(), free_port()
        plugin_dir = next((d for d in ("/usr/lib/x86_64-linux-gnu/slurm-wlm",
                                       "/usr/lib/aarch64-linux-gnu/slurm-wlm",
                                       "/usr/lib/slurm-wlm", "/usr/lib64/slurm")
                           if os.path.isdir(d)), None)
        conf = f"""# Written by tests/deploy/slurm_test.py: one node, this host, nothing shared.
ClusterName=ddptest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={self.path("state")}
SlurmdSpoolDir={self.path("spool", "%n")}
SlurmctldPidFile={self.path("run", "slurmctld.pid")}
SlurmdPidFile={self.path("run", "slurmd.pid")}
SlurmctldLogFile={self.path("log", "slurmctld.log")}
SlurmdLogFile={self.path("log", "slurmd.log")}
# No systemd and no cgroup delegation in a container: track processes by parentage,
# bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# SIGTERM to SIGKILL at scancel: the workers need their trainers' --stop-grace and a
# Leave RPC; the test's jobs on them are gone by then.
KillWait=30
MinJobAge=300
SlurmdTimeout=60
InactiveLimit=0
{"PluginDir=" + plugin_dir if plugin_dir else ""}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=ddp Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(conf)
        self.spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.env["SLURM_CONF"]])
        self.spawn("slurmd", ["slurmd", "-D", "-f", self.env["SLURM_CONF"]])

        def idle():
            self.check_alive()
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
            return r.returncode == 0 and f"{self.node} idle" in r.stdout
        wait_for("the Slurm node to be idle (sinfo)", idle, 60, interval=0.5)
        log(f"Slurm up: node {self.node}, {cpus} CPUs, slurmctld :{ctld_port}, "
            f"slurmd :{slurmd_port}")

    def stop_slurm_jobs(self):
        if not os.path.exists(self.env["SLURM_CONF"]):
            return
        self.run(["scancel", "--partition=ddp"], check=False, timeout=10)
        try:
            wait_for("Slurm jobs to end", lambda: self.run(
                ["squeue", "-h", "-t", "PD,R,CG"], check=False, timeout=10).stdout.strip() == "",
                40, interval=0.5)
        except (Failure, subprocess.TimeoutExpired) as e:
            log(f"cleanup: {e}")

    # --- ddp -----------------------------------------------------------------------
    def start_ddp(self):
        port = free_port()
        self.coordinator = f"127.0.0.1:{port}"
        self.env["DDP_COORDINATOR"] = self.coordinator
        self.spawn("coordinator", [os.path.join(self.bin, "ddp-coordinator"),
                                   "--listen", self.coordinator,
                                   "--state-dir", self.path("coordinator-state"),
                                   "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT_S}s"])
        self.spawn("static-worker", [os.path.join(self.bin, "ddp-worker"),
                                     "--coordinator", self.coordinator, "--name", "static-1",
                                     "--slots", "1", "--cpus", "1", "--label", "pool=static",
                                     "--work-dir", self.path("static-1")])
        wait_for("the static worker to register",
                 lambda: [w for w in self.workers(starting=True) if w["name"] == "static-1"],
                 60)
        log(f"ddp-coordinator on {self.coordinator}, worker static-1 (pool=static) registered")

    def ddpctl(self, *args, timeout=30):
        return self.run([os.path.join(self.bin, "ddpctl"), *args], timeout=timeout)

    def workers(self, starting=False):
        # While the coordinator starts, no answer is no workers; after, it is a failure
        # (an empty list must not pass for workers that left).
        self.check_alive()
        r = self.run([os.path.join(self.bin, "ddpctl"), "workers", "-o", "json"],
                     check=not starting)
        return json.loads(r.stdout).get("workers", []) if r.returncode == 0 else []

    def job(self, job_id):
        return json.loads(self.ddpctl("get", job_id, "-o", "json").stdout)

    def submit(self, name, spec):
        path = self.path(name + ".yaml")
        with open(path, "w") as f:
            f.write(spec)
        return self.ddpctl("submit", path).stdout.strip()

    def wait_job(self, job_id, states, timeout):
        def reached():
            j = self.job(job_id)
            return j if j.get("state") in states else None
        try:
            return wait_for(f"job {job_id} to reach {'/'.join(states)}", reached, timeout, 0.5)
        except Interrupted:
            raise
        except Failure:
            j = self.job(job_id)
            raise Failure(f"job {job_id} is {j.get('state')} ({j.get('reason')}), wanted "
                          f"{'/'.join(states)}; attempts: {json.dumps(j.get('attempts'))}")

    def check_alive(self):
        for name, p in self.procs:
            if p.poll() is not None:
                raise Failure(f"{name} exited with {p.returncode} (log: {name}.log)")

    # --- cleanup -------------------------------------------------------------------
    def stop(self):
        self.stop_slurm_jobs()
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                log(f"cleanup: {name} ignored SIGTERM; SIGKILL")
                p.kill()
                p.wait()
        self.kill_strays()

    def kill_strays(self):
        # Job steps (slurmstepd and what it ran) outlive slurmd by design; anything
        # still running with our SLURM_CONF is ours.
        mine = ("SLURM_CONF=" + self.env["SLURM_CONF"]).encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mine in f.read().split(b"\0"):
                        log(f"cleanup: killing stray process {pid}")
                        os.kill(int(pid), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    def dump_logs(self):
        logdir = self.path("log")
        files = sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []
        files += [f for f in sorted(os.listdir(self.tmp)) if f.endswith(".out")]
        for name in files:
            p = os.path.join(logdir, name) if os.path.exists(os.path.join(logdir, name)) \
                else self.path(name)
            with open(p, errors="replace") as f:
                lines = f.readlines()
            print(f"----- {name} (last 40 lines) -----")
            print("".join(lines[-40:]), end="")


def slurm_workers(cluster, slurm_job):
    return sorted((w for w in cluster.workers()
                   if w.get("labels", {}).get("slurm_job") == slurm_job),
                  key=lambda w: w["name"])


def test(cluster):
    cluster.start_slurm()
    cluster.start_ddp()

    # 1. Two tasks on the one node: two workers.
    # The tasks' TMPDIR, where each worker's work dir goes (and must be gone after).
    task_tmp = cluster.path("task-tmp")
    os.makedirs(task_tmp)
    sbatch_env = dict(cluster.env, DDP_BIN=cluster.bin, TMPDIR=task_tmp)
    t0 = time.monotonic()
    slurm_job = cluster.run(["sbatch", "--parsable", "--nodes=1", "--ntasks=2",
                             "--chdir=" + cluster.tmp, "--output=" + cluster.path("ddp-workers-%j.out"),
                             os.path.join(cluster.src, "deploy/slurm/ddp-workers.sbatch"),
                             "--stop-grace", "5s"], env=sbatch_env).stdout.strip()
    log(f"sbatch: Slurm job {slurm_job}")

    def two_up():
        ws = slurm_workers(cluster, slurm_job)
        return ws if len(ws) == 2 and all(w["alive"] for w in ws) else None
    ws = wait_for(f"2 workers labelled slurm_job={slurm_job}", two_up, 90, 0.5)
    names = [w["name"] for w in ws]
    want = [f"{cluster.node}-{slurm_job}-0", f"{cluster.node}-{slurm_job}-1"]
    if names != want:
        raise Failure(f"Slurm workers are named {names}, expected {want}")
    for w in ws:
        labels = w.get("labels", {})
        if labels.get("slurm_partition") != "ddp":
            raise Failure(f"{w['name']} has labels {labels}, expected slurm_partition=ddp")
    log(f"2 workers up in {time.monotonic() - t0:.1f} s: {', '.join(names)}")
    print(cluster.ddpctl("workers").stdout, end="")
    print(cluster.run(["squeue"]).stdout, end="")

    # 2. A 2-node job selected by the Slurm job id runs there, and succeeds.
    t0 = time.monotonic()
    job = cluster.submit("on-slurm", f"""name: on-slurm
nodes: 2
nproc_per_node: 1
node_selector: {{slurm_job: "{slurm_job}"}}
model:
  mlp: {{hidden: [16]}}
data:
  synthetic: {{samples: 256, features: 8, classes: 2}}
  seed: 0
train:
  threads: 1
  epochs: 2
  batch_size: 32
  optimizer: {{name: sgd, lr: 0.1}}
  seed: 0
""")
    j = cluster.wait_job(job, ["SUCCEEDED", "FAILED", "CANCELLED"], 180)
    if j["state"] != "SUCCEEDED":
        raise Failure(f"job {job} ended {j['state']}: {j.get('reason')}")
    ran_on = sorted(r["worker"] for r in j["attempts"][-1]["ranks"])
    if ran_on != want:
        raise Failure(f"job {job} ran on {ran_on}, expected {want}")
    log(f"job {job} (node_selector slurm_job={slurm_job}) SUCCEEDED in "
        f"{time.monotonic() - t0:.1f} s on {', '.join(ran_on)}")

    # 3. scancel: the Slurm workers leave at once; a job elsewhere is untouched.
    other = cluster.submit("elsewhere", """name: elsewhere
nodes: 1
node_selector: {pool: static}
max_restarts: 0
command: [/bin/sleep, "12"]
""")
    cluster.wait_job(other, ["RUNNING"], 60)
    t0 = time.monotonic()
    cluster.run(["scancel", slurm_job])
    wait_for("the Slurm workers to leave `ddpctl workers`",
             lambda: not slurm_workers(cluster, slurm_job), LEAVE_WITHIN_S, 0.1)
    gone_s = time.monotonic() - t0
    log(f"scancel {slurm_job}: its workers left `ddpctl workers` in {gone_s:.1f} s "
        f"(heartbeat timeout {HEARTBEAT_TIMEOUT_S} s)")
    wait_for(f"Slurm job {slurm_job} to end", lambda: cluster.run(
        ["squeue", "-h", "-j", slurm_job], check=False).stdout.strip() == "", 60, 0.5)
    out = open(cluster.path(f"ddp-workers-{slurm_job}.out"), errors="replace").read()
    for task in ("0", "1"):  # srun --label: each line starts with its task.
        if not any(line.startswith(f"{task}: ") and "left the cluster" in line
                   for line in out.splitlines()):
            raise Failure(f"task {task}'s worker did not say it left the cluster "
                          f"(ddp-workers-{slurm_job}.out)")
    if f"work dir {task_tmp}/ddp-worker-" not in out:
        raise Failure(f"the workers' work dirs were not under the tasks' TMPDIR {task_tmp}")
    left = os.listdir(task_tmp)
    if left:
        raise Failure(f"the workers' work dirs are still there: {left}")
    j = cluster.wait_job(other, ["SUCCEEDED", "FAILED", "CANCELLED"], 60)
    if j["state"] != "SUCCEEDED" or j.get("restarts", 0) != 0 or len(j["attempts"]) != 1:
        raise Failure(f"job {other} on static-1 ended {j['state']} after "
                      f"{len(j['attempts'])} attempt(s): {j.get('reason')}")
    # The allocation is gone, and its selector matches nothing else: a job for it waits.
    stranded = cluster.submit("stranded", f"""name: stranded
nodes: 2
node_selector: {{slurm_job: "{slurm_job}"}}
command: [/bin/true]
""")
    def waits():
        j = cluster.job(stranded)
        if j["state"] != "PENDING":
            raise Failure(f"job {stranded} for the ended allocation is {j['state']} "
                          f"({j.get('reason')}), expected PENDING")
        return j if f"slurm_job={slurm_job}" in j.get("reason", "") else None
    j = wait_for(f"job {stranded}'s reason to name slurm_job={slurm_job}", waits, 10)
    log(f"job {stranded} for the ended allocation waits: {j['reason']}")
    cluster.ddpctl("cancel", stranded)
    remaining = [w["name"] for w in cluster.workers()]
    if remaining != ["static-1"]:
        raise Failure(f"workers after scancel: {remaining}, expected only static-1")
    log(f"job {other} on static-1 SUCCEEDED in one attempt; workers now: {remaining}")
    print(cluster.ddpctl("workers").stdout, end="")


def main(argv):
    if len(argv) != 3:
        print("usage: slurm_test.py SOURCE_DIR BIN_DIR", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("SKIP: needs root (it runs its own slurmctld, slurmd and munged)")
        return SKIP
    missing = [p for p in SLURM_PROGRAMS if shutil.which(p) is None]
    if missing:
        print(f"SKIP: {', '.join(missing)} not installed (Debian packages slurmctld, slurmd, "
              "slurm-client, munge; scripts/install_deps.sh)")
        return SKIP
    cluster = Cluster(os.path.abspath(argv[1]), os.path.abspath(argv[2]))
    # ^C, a SIGTERM, and our own deadline (ctest's timeout kills with SIGKILL, and job
    # steps outlive the daemons): clean up like any failure.
    def interrupted(sig, _):
        raise Interrupted(f"the test's deadline of {DEADLINE_S} s passed"
                          if sig == signal.SIGALRM else f"signal {sig}")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, interrupted)
    signal.alarm(DEADLINE_S)
    rc = 1
    try:
        test(cluster)
        rc = 0
        print("PASS")
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}")
        cluster.dump_logs()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            cluster.stop()
        finally:
            shutil.rmtree(cluster.tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
