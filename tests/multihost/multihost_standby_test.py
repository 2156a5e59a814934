"""Coordinators in standby on hosts of their own, and the leader cut off from its store.

    python3 tests/multihost/multihost_standby_test.py BIN_DIR

Five hosts (tests/multihost/netns.py): PostgreSQL on host 0, coordinators A and B on
hosts 1 and 2 sharing it (--store), workers w1 and w2 on hosts 3 and 4 given both
addresses, ddpctl from host 3. Mid-job, A (the leader) is partitioned from the
database host only: it still reaches the workers, and they it. A cannot renew its
lease, refuses calls and steps down once the lease may have lapsed; B takes the lease
and leads; the workers follow B; the job ends SUCCEEDED in its first attempt. Once the
partition heals, A is a standby naming B. Skips (exit 77) where namespaces cannot be
made or iptables is missing. Prints the times.
"""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_on_hosts import Checks  # noqa: E402
from netns import SKIP, Hosts  # noqa: E402

PG_BIN = os.environ.get("DDP_POSTGRES_BIN_DIR", "/usr/lib/postgresql/15/bin")
PG_PORT = 5432
PORT = 7700

bindir = os.path.abspath(sys.argv[1])
why = Hosts.unavailable() or Hosts.no_iptables()
if not why and not os.path.exists(os.path.join(PG_BIN, "initdb")):
    why = "PostgreSQL 15 is not installed (scripts/install_deps.sh installs it)"
if why:
    print("SKIP: " + why)
    sys.exit(SKIP)
check = Checks()
nobody = pwd.getpwnam("nobody")
as_nobody = ["setpriv", "--reuid=%d" % nobody.pw_uid, "--regid=%d" % nobody.pw_gid,
             "--clear-groups"]


def read(path):
    try:
        return open(path).read()
    except OSError:
        return ""


def wait_for(pred, timeout, step=0.1):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return time.time() - t0
        time.sleep(step)
    return None


def main(tmp):
    pgdata = os.path.join(tmp, "pg")
    os.makedirs(pgdata)
    os.chown(tmp, nobody.pw_uid, nobody.pw_gid)
    os.chown(pgdata, nobody.pw_uid, nobody.pw_gid)
    subprocess.run(as_nobody + [os.path.join(PG_BIN, "initdb"), "-D", pgdata, "-U", "ddp",
                                "--auth=trust", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True)
    with open(os.path.join(pgdata, "pg_hba.conf"), "a") as f:
        f.write("host all all 0.0.0.0/0 trust\n")  # The test's own bridge.
    with Hosts(5) as hosts:
        db = hosts[0].addr
        hosts.spawn(0, as_nobody + [os.path.join(PG_BIN, "postgres"), "-D", pgdata,
                                    "-p", str(PG_PORT), "-c", "listen_addresses=" + db,
                                    "-c", "unix_socket_directories=" + pgdata,
                                    "-c", "fsync=off",
                                    # Segments under pgdata, not /dev/shm: the server
                                    # is killed with its host at the end.
                                    "-c", "dynamic_shared_memory_type=mmap"],
                    log=os.path.join(tmp, "postgres.log"))
        hosts.wait_listening(0, db, PG_PORT)
        r = hosts.run(0, as_nobody + [os.path.join(PG_BIN, "createdb"), "-h", db, "-p",
                                      str(PG_PORT), "-U", "ddp", "ddp"])
        check(r.returncode == 0, "createdb: " + r.stderr.strip())
        store = "postgresql://ddp@%s:%d/ddp" % (db, PG_PORT)
        addrs = {1: "%s:%d" % (hosts[1].addr, PORT), 2: "%s:%d" % (hosts[2].addr, PORT)}
        both = ",".join(addrs.values())
        logs = {i: os.path.join(tmp, "coordinator-%d.log" % i) for i in addrs}
        timing = ["--rpc-deadline=200ms", "--heartbeat-interval=500ms",
                  "--heartbeat-timeout=5s"]
        hosts.spawn(1, [os.path.join(bindir, "ddp-coordinator"), "--listen", addrs[1],
                        "--store", store, "--insecure", *timing], log=logs[1])
        hosts.wait_listening(3, hosts[1].addr, PORT)
        check(wait_for(lambda: "leading on" in read(logs[1]), 30) is not None,
              "A leads (the first to start)")
        hosts.spawn(2, [os.path.join(bindir, "ddp-coordinator"), "--listen", addrs[2],
                        "--store", store, "--insecure", *timing], log=logs[2])
        check(wait_for(lambda: "standby: this coordinator is a standby" in read(logs[2]), 30)
              is not None, "B stands by")
        for i, name in ((3, "w1"), (4, "w2")):
            hosts.spawn(i, [os.path.join(bindir, "ddp-worker"), "--coordinator", both,
                            "--name", name, "--advertise-addr", hosts[i].addr,
                            "--work-dir", os.path.join(tmp, "work-" + name), "--cpus", "1"],
                        log=os.path.join(tmp, name + ".log"))

        def ctl(*args, timeout=60):
            return hosts.run(3, [os.path.join(bindir, "ddpctl"), *args, "--coordinator", both],
                             timeout=timeout)

        def job(job_id):
            r = ctl("get", job_id, "-o", "json", timeout=30)
            return json.loads(r.stdout) if r.returncode == 0 else None

        def alive():
            r = ctl("workers", "-o", "json", timeout=30)
            if r.returncode != 0:
                return set()
            return {w["name"] for w in json.loads(r.stdout)["workers"] if w.get("alive")}

        check(wait_for(lambda: alive() == {"w1", "w2"}, 60, 0.5) is not None,
              "both workers registered")
        spec = os.path.join(tmp, "job.yaml")
        with open(spec, "w") as f:
            f.write("name: standby\nnodes: 2\nmodel: {mlp: {hidden: [128, 128]}}\n"
                    "data: {synthetic: {samples: 20000, features: 64, classes: 10}}\n"
                    "train: {epochs: 12, batch_size: 32, threads: 1}\n"
                    "metrics: {every_steps: 20}\n")
        r = ctl("submit", spec, "-o", "json")
        check(r.returncode == 0, "submitted: " + r.stderr.strip())
        job_id = json.loads(r.stdout)["id"]

        def stepped(n):
            j = job(job_id)
            return j is not None and j.get("state") == "RUNNING" and \
                len(j.get("metrics", [])) == 2 and \
                all(int(m.get("global_step", 0)) > n for m in j["metrics"])

        check(wait_for(lambda: stepped(100), 120, 0.5) is not None, "the job trains")

        # A loses the database, and only the database.
        hosts.partition(1, 0)
        cut = time.time()
        down = wait_for(lambda: "stepping down" in read(logs[1]), 30)
        check(down is not None, "A stepped down %.1f s after losing its store" % (down or -1))
        took = wait_for(lambda: "leading on" in read(logs[2]), 30)
        check(took is not None, "B leads %.1f s after the cut" % (time.time() - cut))
        check("took the lease with epoch 2" in read(logs[2]), "B took the lease with epoch 2")
        check(wait_for(lambda: stepped(400), 120, 0.5) is not None,
              "the job goes on under B, the workers following it")
        hosts.heal_links()
        check(wait_for(lambda: read(logs[1]).count("standby: this coordinator is a standby; "
                                                     "the leader is at " + addrs[2]) > 0, 60)
              is not None, "healed, A stands by and names B")

        def ended():
            j = job(job_id)
            return j is not None and j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")

        check(wait_for(ended, 300, 1) is not None, "the job ended")
        j = job(job_id) or {}
        check(j.get("state") == "SUCCEEDED", "SUCCEEDED (%s)" % j.get("state"))
        check(len(j.get("attempts", [])) == 1 and int(j.get("restarts", 0)) == 0,
              "in its first attempt, no restart")
        for name in ("w1", "w2"):
            check("fencing" not in read(os.path.join(tmp, name + ".log")),
                  "%s fenced nothing" % name)


tmp = tempfile.mkdtemp(prefix="ddp-mh-standby-")
try:
    main(tmp)
except Exception as e:  # noqa: BLE001
    check(False, "error: %s" % e)
finally:
    if check.failures:
        for name in ("coordinator-1", "coordinator-2", "w1", "w2", "postgres"):
            print("---- %s ----\n%s" % (name, read(os.path.join(tmp, name + ".log"))[-4000:]))
    shutil.rmtree(tmp, ignore_errors=True)
check.exit()
