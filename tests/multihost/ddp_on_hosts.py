"""ddp's processes on the hosts of netns.py: the multi-host tests' shared set-up.

    ddp = DdpOnHosts(hosts, bindir, tmp, workers={1: "w1", 2: "w2"})
    ddp.ctl(3, "get", job_id, "-o", "json")     # ddpctl from host 3
    ddp.alive(3)                                 # {"w1", "w2"} or None

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
        hosts.spawn(coordinator, [self.bin("ddp-coordinator"), "--listen", self.addr,
                                  "--state-dir", os.path.join(tmp, "state"), *security,
                                  *coordinator_args], log=self.log_path("coordinator"))
        for i, name in workers.items():
            hosts.spawn(i, [self.bin("ddp-worker"), "--coordinator", self.addr, "--name", name,
                            "--advertise-addr", hosts[i].addr, *worker_security[name],
                            "--work-dir", os.path.join(tmp, "work-" + name), *worker_args],
                        log=self.log_path(name))

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
