"""ddp's processes on the hosts of netns.py: the multi-host tests' shared set-up.

    ddp = DdpOnHosts(hosts, bindir, tmp, workers={1: "w1", 2: "w2"})
    ddp.ctl(3, "get", job_id, "-o", "json")     # ddpctl from host 3
    ddp.alive(3)                                 # {"w1", "w2"} or None
    ddp.start_worker(3, "w3"); ddp.kill_coordinator(); ddp.start_coordinator()
    watch = Watch([job_id], [ckpt_dir]); ...; watch.stop(); watch.doubles()

A coordinator on host `coordinator` and a ddp-worker per entry of `workers` with its
host's address as --advertise-addr; each one's output in TMP/<name>.log. They stop with
the Hosts they run on. With `tls` (pass the source tree), as a secured cluster runs:
certificates from scripts/make_certs.sh whose SAN is the coordinator host's address,
mTLS for the workers (a client certificate each) and an admin token for ddpctl;
without, plaintext on the test's own bridge (--insecure).
"""
import json
import os
import subprocess
import threading
import time

PORT = 7700


class DdpOnHosts:
    def __init__(self, hosts, bindir, tmp, workers, coordinator=0, coordinator_args=(),
                 worker_args=(), tls=None):
        self.hosts, self.bindir, self.tmp = hosts, bindir, tmp
        self.coordinator = hosts[coordinator]
        self.addr = "%s:%d" % (self.coordinator.addr, PORT)
        self.client_args = []
        security = ["--insecure"]
        worker_security = {name: [] for name in workers.values()}
        if tls:
            certs = os.path.join(tmp, "certs")
            subprocess.run(["bash", os.path.join(tls, "scripts", "make_certs.sh"), certs,
                            "--san", self.coordinator.addr,
                            *[a for name in workers.values() for a in ("--worker", name)]],
                           check=True, capture_output=True)
            c = lambda f: os.path.join(certs, f)  # noqa: E731
            security = ["--tls-cert", c("coordinator.pem"), "--tls-key", c("coordinator.key"),
                        "--tls-ca", c("ca.pem"), "--auth-token-file", c("tokens")]
            worker_security = {name: ["--tls-ca", c("ca.pem"), "--tls-cert", c(name + ".pem"),
                                      "--tls-key", c(name + ".key")]
                               for name in workers.values()}
            self.client_args = ["--tls-ca", c("ca.pem"), "--token-file", c("admin.token")]
        self._coordinator_argv = [self.bin("ddp-coordinator"), "--listen", self.addr,
                                  "--state-dir", os.path.join(tmp, "state"), *security,
                                  *coordinator_args]
        self._coordinator_index = coordinator
        self._coordinator_starts = 0
        self.start_coordinator()
        self._worker_args = list(worker_args)
        self.worker_procs = {}
        self._worker_security = worker_security
        for i, name in workers.items():
            self.start_worker(i, name)

    def start_worker(self, i, name, security=()):
        """A ddp-worker `name` on host i (one of `workers`, or a new one with `security`)."""
        self.worker_procs[name] = self.hosts.spawn(
            i, [self.bin("ddp-worker"), "--coordinator", self.addr, "--name", name,
                "--advertise-addr", self.hosts[i].addr,
                *self._worker_security.get(name, security),
                "--work-dir", os.path.join(self.tmp, "work-" + name), *self._worker_args],
            log=self.log_path(name))
        return self.worker_procs[name]

    def kill_worker(self, name):
        """SIGKILL to worker `name` (a crash: its ranks die with it, PR_SET_PDEATHSIG)."""
        p = self.worker_procs[name]
        if p.poll() is None:
            p.kill()
            p.wait()

    def start_coordinator(self):
        """Starts the coordinator (again, after kill_coordinator(): same state dir); its
        output in TMP/coordinator.log, then coordinator-2.log, ..."""
        self._coordinator_starts += 1
        n = self._coordinator_starts
        self.coordinator_proc = self.hosts.spawn(
            self._coordinator_index, self._coordinator_argv,
            log=self.log_path("coordinator" + ("" if n == 1 else "-%d" % n)))

    def kill_coordinator(self):
        """SIGKILL to the coordinator: a crash."""
        self.coordinator_proc.kill()
        self.coordinator_proc.wait()

    def bin(self, name):
        return os.path.join(self.bindir, name)

    def log_path(self, name):
        return os.path.join(self.tmp, name + ".log")

    def wait_listening(self, host):
        self.hosts.wait_listening(host, self.coordinator.addr, PORT)

    def ctl(self, host, *args, timeout=60, check=True):
        """ddpctl ARGS from `host`: its stdout; a failure raises, or is None without check."""
        r = self.hosts.run(host, [self.bin("ddpctl"), *args, "--coordinator", self.addr,
                                  *self.client_args], timeout=timeout)
        if r.returncode != 0:
            if check:
                raise RuntimeError("ddpctl %s: %s" % (" ".join(args), r.stderr.strip()))
            return None
        return r.stdout

    def workers(self, host):
        """The coordinator's workers, as `ddpctl workers -o json` lists them (None when
        ddpctl fails)."""
        out = self.ctl(host, "workers", "-o", "json", timeout=10, check=False)
        return None if out is None else json.loads(out)["workers"]

    def alive(self, host):
        """The names of the workers the coordinator counts alive (None when ddpctl fails)."""
        ws = self.workers(host)
        return None if ws is None else {w["name"] for w in ws if w.get("alive")}


    def wait_workers(self, host, names, timeout=60):
        """Waits until the workers `names` are alive; returns `ddpctl workers`' list."""
        deadline = time.time() + timeout
        while True:
            workers = self.workers(host) or []
            if set(names) <= {w["name"] for w in workers if w.get("alive")}:
                return workers
            if time.time() > deadline:
                raise RuntimeError("the workers did not register: %s" % workers)
            time.sleep(0.3)

    def submit(self, host, spec):
        return json.loads(self.ctl(host, "submit", spec, "-o", "json"))["id"]

    def job(self, host, job_id):
        return json.loads(self.ctl(host, "get", job_id, "-o", "json"))

    def wait_job(self, host, job_id, timeout=240):
        """The job once it ended (or as it is at the timeout)."""
        deadline = time.time() + timeout
        while True:
            j = self.job(host, job_id)
            if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") or time.time() > deadline:
                return j
            time.sleep(0.5)


def rank_processes(job_ids):
    """{(job id, rank): [(pid, attempt, node)]}: the live rank processes (process group
    leaders, as ddp-worker starts them; zombies not counted) of these jobs, read from
    /proc. Network namespaces share one process table, so this sees every host's."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) != int(pid):
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except (OSError, ValueError, IndexError):
            continue
        job = env.get(b"DDP_JOB_ID", b"").decode()
        if job in job_ids and b"RANK" in env:
            out.setdefault((job, int(env[b"RANK"])), []).append(
                (int(pid), int(env.get(b"DDP_ATTEMPT", b"0")), env.get(b"DDP_NODE", b"").decode()))
    return out


def newest_checkpoint(directory):
    """The global step of the newest checkpoint-<step>.pt in `directory` (-1: none)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return -1
    steps = [int(n[len("checkpoint-"):-len(".pt")]) for n in names
             if n.startswith("checkpoint-") and n.endswith(".pt")]
    return max(steps, default=-1)


class Watch:
    """Samples, every 50 ms until stop(), what the invariants are about: every live rank
    process of `job_ids` (rank_processes), and the newest checkpoint in each of
    `checkpoint_dirs`. Then: doubles() (two live processes holding one rank of a job,
    with the time seen), backwards() (a newest checkpoint that went down), and
    gone_at(pred) (when the processes `pred` picks were last seen, +50 ms)."""

    def __init__(self, job_ids, checkpoint_dirs=()):
        # A set or list passed in is read at every sample: a caller may add to it.
        self.job_ids = job_ids if isinstance(job_ids, set) else set(job_ids)
        self.dirs = checkpoint_dirs if isinstance(checkpoint_dirs, list) else list(checkpoint_dirs)
        self.samples = []  # (time, rank_processes, {dir: newest step})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.time(), rank_processes(set(self.job_ids)),
                                 {d: newest_checkpoint(d) for d in list(self.dirs)}))
            self._stop.wait(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join()

    def doubles(self):
        return [(t, key, procs) for t, ranks, _ in self.samples
                for key, procs in ranks.items() if len(procs) > 1]

    def backwards(self):
        out, newest = [], {}
        for t, _, steps in self.samples:
            for d, step in steps.items():
                if step < newest.get(d, -1):
                    out.append((t, d, newest[d], step))
                newest[d] = max(newest.get(d, -1), step)
        return out

    def last_seen(self, pred):
        """When a process that pred(job, rank, attempt, node) picks was last seen."""
        seen = [t for t, ranks, _ in self.samples for (job, rank), procs in ranks.items()
                for _, attempt, node in procs if pred(job, rank, attempt, node)]
        return max(seen, default=None)


class Checks:
    """Named checks: each printed as it is made, the failed ones kept for the end."""

    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        print(("ok: " if ok else "FAIL: ") + what, flush=True)
        if not ok:
            self.failures.append(what)

    def exit(self):
        if self.failures:
            raise SystemExit("FAIL:\n  " + "\n  ".join(self.failures))
        print("PASS")
