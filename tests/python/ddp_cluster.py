"""A real ddp cluster on loopback for the Python client's tests: build/bin/ddp-coordinator
on a free port with a temporary state directory and N build/bin/ddp-worker processes,
as tests/integration/local_cluster.cc starts them (fast heartbeats; optionally TLS,
worker certificates and tokens from scripts/make_certs.sh). Everything it starts is
stopped, and its directory removed, by stop() (also when start() fails half-way).
The benchmarks (bench/recovery.py, bench/start_latency.py and those that import them)
start theirs with it too: `heartbeats="default"` runs the coordinator with its own
timings, as a user runs it, and `worker_flags` go to every worker.
"""
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
from ddp_test_ports import claim_port, claim_port_block  # noqa: E402


def free_port(taken):
    """A port of this test's own (tests/common/ddp_test_ports.py: below the ephemeral
    range, where connecting to a closed port on loopback cannot "succeed" by TCP
    self-connect, and claimed against tests run beside this one), added to `taken`."""
    return claim_port(taken)


def stage_example(source_dir, name, dir):
    """Copies examples/<name> into dir/examples with dir/data linked to the repository's
    data/, so its relative paths resolve and its checkpoints stay out of the source tree
    (local_cluster.cc's StageExample); returns the copy's path."""
    source_dir = os.path.abspath(source_dir)
    os.makedirs(os.path.join(dir, "examples"), exist_ok=True)
    data = os.path.join(dir, "data")
    if not os.path.exists(data):
        os.symlink(os.path.join(source_dir, "data"), data)
    copy = os.path.join(dir, "examples", name)
    shutil.copyfile(os.path.join(source_dir, "examples", name), copy)
    return copy


class Cluster:
    """`workers` ddp-workers w1, w2, ... (with `names`: NAME-w1, ...) of `slots` slots
    and `cpus` CPUs each (one and one). `heartbeats`: "fast" (200-ms interval, 5-s
    timeout, 100-ms RPC deadline, the workers' stop grace 3 s: the tests') or "default"
    (the coordinator's and the workers' own). `dir`: the parent of its temporary
    directory."""

    def __init__(self, bin_dir, source_dir, workers=2, secure=False, coordinator_flags=(),
                 worker_flags=(), heartbeats="fast", names="", dir=None, slots=1, cpus=1):
        self.bin_dir = os.path.abspath(bin_dir)
        self.coordinator_flags = list(coordinator_flags)  # Extra ddp-coordinator flags.
        self.worker_flags = list(worker_flags)  # Extra flags for every ddp-worker.
        if heartbeats not in ("fast", "default"):
            raise ValueError("heartbeats: 'fast' or 'default', not %r" % (heartbeats,))
        self.heartbeats = heartbeats
        self.names = names
        self.slots, self.cpus = slots, cpus
        self.source_dir = os.path.abspath(source_dir)
        self.n_workers = workers
        self.secure = secure
        self.dir = tempfile.mkdtemp(prefix="ddp-pyclient-", dir=dir)
        self.procs = []  # (name, Popen, log path)
        self.ports = set()
        self.port = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    @property
    def certs(self):
        return os.path.join(self.dir, "certs")

    def _spawn(self, name, argv):
        log = os.path.join(self.dir, name + ".log")
        with open(log, "ab") as out:  # A restarted coordinator's output follows.
            # A session of its own: stop() signals the process group, so trainers a
            # worker left behind go too.
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.dir,
                                    start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def start(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        for binary in ("ddp-coordinator", "ddp-worker", "ddp-trainer"):
            path = os.path.join(self.bin_dir, binary)
            if not os.access(path, os.X_OK):
                raise RuntimeError("%s is missing: build it first (cmake --build build "
                                   "--target %s)" % (path, binary))
        if self.secure:
            argv = ["bash", os.path.join(self.source_dir, "scripts", "make_certs.sh"),
                    self.certs]
            for i in range(self.n_workers):
                name = "w%d" % (i + 1)
                argv += ["--worker", "%s-%s" % (self.names, name) if self.names else name]
            made = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            if made.returncode != 0:
                raise RuntimeError("make_certs.sh failed: " + made.stderr)
        self.port = free_port(self.ports)
        argv = [os.path.join(self.bin_dir, "ddp-coordinator"), "--listen", self.address,
                "--state-dir", os.path.join(self.dir, "state")]
        if self.heartbeats == "fast":
            # 5 s, not local_cluster.cc's 2: a coordinator restarted mid-job (test_7)
            # must be back before the workers ask each other and fence (fence.h), on a
            # machine loaded with other tests too.
            argv += ["--rpc-deadline=100ms", "--heartbeat-interval=200ms",
                     "--heartbeat-timeout=5000ms"]
        argv += self.coordinator_flags
        if self.secure:
            c = self.certs
            argv += ["--tls-cert", c + "/coordinator.pem", "--tls-key", c + "/coordinator.key",
                     "--tls-ca", c + "/ca.pem", "--auth-token-file", c + "/tokens"]
        self._coordinator_argv = argv
        self._start_coordinator()
        for i in range(self.n_workers):
            self.add_worker("w%d" % (i + 1))

    def add_worker(self, name):
        """Starts one more ddp-worker, `name` (with `names`: NAME-name); its Popen."""
        full = "%s-%s" % (self.names, name) if self.names else name
        argv = [os.path.join(self.bin_dir, "ddp-worker"), "--coordinator", self.address,
                "--name", full, "--slots", str(self.slots), "--cpus", str(self.cpus),
                *(["--stop-grace", "3s"] if self.heartbeats == "fast" else []),
                "--work-dir", os.path.join(self.dir, name),
                "--health-listen", "127.0.0.1:%d" % free_port(self.ports)]
        # Its jobs' store ports from a block of this test's own (local_cluster.cc).
        first, count = claim_port_block()
        argv.append("--store-ports=%d-%d" % (first, first + count - 1))
        if self.secure:
            c = self.certs
            argv += ["--tls-ca", c + "/ca.pem", "--tls-cert", "%s/%s.pem" % (c, full),
                     "--tls-key", "%s/%s.key" % (c, full)]
        return self._spawn(name, argv + self.worker_flags)

    def process(self, name):
        """The newest Popen of `name` ("coordinator", "w1", ...)."""
        return [proc for n, proc, _ in self.procs if n == name][-1]

    def ctl(self, *args, check=True, timeout=60):
        """ddpctl ARGS against this cluster (plaintext only): its stdout; a failure
        raises, or is None without `check`. Exit 3 (`get` of a job that FAILED) counts as
        an answer."""
        r = subprocess.run([os.path.join(self.bin_dir, "ddpctl"), *args, "--coordinator",
                            self.address], capture_output=True, text=True, timeout=timeout)
        if r.returncode not in (0, 3):
            if check:
                raise RuntimeError("ddpctl %s: %s" % (" ".join(args), r.stderr.strip()))
            return None
        return r.stdout

    def job(self, job_id, history=False):
        """`ddpctl get JOB -o json` (with `history`: --history) as a dict."""
        return json.loads(self.ctl("get", job_id, "-o", "json",
                                   *(["--history"] if history else [])))

    def _start_coordinator(self):
        coordinator = self._spawn("coordinator", self._coordinator_argv)
        deadline = time.monotonic() + 20
        while True:
            if coordinator.poll() is not None:
                raise RuntimeError("the coordinator exited (%s): %s" %
                                   (coordinator.returncode, self.log("coordinator")))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the coordinator did not come up: " +
                                       self.log("coordinator"))
                time.sleep(0.1)

    def restart_coordinator(self):
        """SIGTERM to the coordinator, then the same one again (port, state directory);
        the workers and their trainers carry on meanwhile."""
        for name, proc, _ in self.procs:
            if name == "coordinator" and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        self._start_coordinator()

    def wait_for_workers(self, client=None, timeout=30):
        """Until `client` (a ddp.Client; None: ddpctl) sees every worker registered and
        alive."""
        deadline = time.monotonic() + timeout
        while True:
            if client is not None:
                workers = client.workers()
            else:
                out = self.ctl("workers", "-o", "json", check=False, timeout=10)
                workers = json.loads(out).get("workers", []) if out else []
            alive = [w for w in workers if w.get("alive")]
            if len(alive) >= self.n_workers:
                return alive
            if time.monotonic() > deadline:
                raise RuntimeError("%d of %d workers alive after %ds:\n%s" %
                                   (len(alive), self.n_workers, timeout, self.logs()))
            time.sleep(0.2)

    def token_file(self, role):
        return os.path.join(self.certs, role + ".token")

    def log(self, name):
        path = os.path.join(self.dir, name + ".log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()[-4000:]

    def logs(self):
        names = sorted({n for n, _, _ in self.procs})
        return "\n".join("--- %s ---\n%s" % (n, self.log(n)) for n in names)

    def stop(self):
        # Workers first (they stop their trainers), then the coordinator.
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, proc, _ in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # Its group: leftovers included.
            except (ProcessLookupError, PermissionError):
                pass
            if proc.poll() is None:
                proc.wait(timeout=10)
        self.procs = []
        if os.environ.get("DDP_KEEP_TEST_DIR"):
            print("kept", self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
