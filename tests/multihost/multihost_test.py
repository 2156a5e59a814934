"""ddp across hosts: a coordinator, two workers and a client, each on a host of its own
(network namespaces on one bridge, tests/multihost/netns.py), no loopback between them.

    python3 tests/multihost/multihost_test.py BIN_DIR SOURCE_DIR

- both workers register with their own addresses (--advertise-addr);
- ddpctl runs from a host that is neither the coordinator's nor a worker's;
- a 2-node job of the built-in trainer and a 2-node PyTorch command job (Debian's
  torch, Gloo) train to SUCCEEDED across the hosts: each rank's address is its worker's,
  rank 0's worker hosts the rendezvous (MASTER_ADDR), and the ranks' Gloo listens on the
  hosts' own interface (GLOO_SOCKET_IFNAME from --advertise-addr; this machine's host
  name resolves to loopback, where Gloo would listen otherwise);
- nothing is left behind: processes and namespaces.
Plaintext gRPC on the test's own bridge (the coordinator's --insecure); the same over
mTLS, with certificates for the hosts' addresses, is still to come (issue 30).
Skips (exit 77) where namespaces cannot be made.
"""
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_on_hosts import Checks, DdpOnHosts  # noqa: E402
from netns import SKIP, Hosts  # noqa: E402

bindir, source = (os.path.abspath(a) for a in sys.argv[1:3])
why = Hosts.unavailable()
if why:
    print("SKIP: " + why)
    sys.exit(SKIP)

check = Checks()


def main(tmp):
    with Hosts(4) as hosts:
        w1, w2, client = hosts[1], hosts[2], hosts[3]
        # Command jobs are off by default with --insecure on a non-loopback address.
        ddp = DdpOnHosts(hosts, bindir, tmp, workers={1: "w1", 2: "w2"},
                         coordinator_args=("--command-jobs", "users"),
                         worker_args=("--slots", "1", "--allow-exec", "/usr/bin/python3"))

        def ctl(*args, timeout=60):
            return ddp.ctl(client.index, *args, timeout=timeout)

        ddp.wait_listening(client.index)
        deadline = time.time() + 60
        while True:
            workers = ddp.workers(client.index) or []
            if len([w for w in workers if w.get("alive")]) >= 2:
                break
            if time.time() > deadline:
                raise RuntimeError("the workers did not register: %s" % workers)
            time.sleep(0.3)
        addrs = {w["name"]: w.get("address") for w in workers}
        check(addrs == {"w1": w1.addr, "w2": w2.addr},
              "the workers registered with their hosts' addresses: %s" % addrs)
        for line in open(ddp.log_path("w1")):
            if "Gloo binds" in line:
                check("eth0" in line, "w1 says where ranks' Gloo binds: " + line.strip())
                break
        else:
            check(False, "w1 says where ranks' Gloo binds")

        data = os.path.join(source, "data", "breast_cancer.csv")
        builtin = os.path.join(tmp, "builtin.yaml")
        with open(builtin, "w") as f:
            f.write("name: across-hosts\nnodes: 2\nnproc_per_node: 1\n"
                    "model: {mlp: {hidden: [16]}}\n"
                    "data: {csv: {path: %s, skip_rows: 1, label_column: -1, standardize: true}}\n"
                    "train: {epochs: 2, batch_size: 16, optimizer: {name: adam, lr: 0.001}}\n" % data)
        script_dir = os.path.join(tmp, "script")
        shutil.copytree(os.path.join(source, "examples", "pytorch"), script_dir)
        command = os.path.join(script_dir, "job.yaml")
        with open(command, "w") as f:
            f.write("name: pytorch-across-hosts\nnodes: 2\nnproc_per_node: 1\n"
                    "command: [/usr/bin/python3, train.py, --data, %s, --checkpoint-dir, %s, "
                    "--epochs, \"1\", --num-workers, \"0\"]\n"
                    % (data, os.path.join(tmp, "ckpt")))
        for spec in (builtin, command):
            job = json.loads(ctl("submit", spec, "-o", "json"))["id"]
            deadline = time.time() + 240
            while True:
                j = json.loads(ctl("get", job, "-o", "json"))
                if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    break
                if time.time() > deadline:
                    break
                time.sleep(0.5)
            what = os.path.basename(spec)
            check(j["state"] == "SUCCEEDED", "%s across hosts: %s %s" % (what, j["state"],
                                                                       j.get("reason", "")))
            if j["state"] != "SUCCEEDED":
                print(ctl("logs", job))
            ranks = {int(r.get("rank", 0)): r for a in j.get("attempts", [])[-1:]
                     for r in a.get("ranks", [])}
            check(sorted(ranks) == [0, 1] and
                  {ranks[0].get("address"), ranks[1].get("address")} == {w1.addr, w2.addr},
                  "%s: each rank on its own host: %s" % (
                      what, {r: (v.get("worker"), v.get("address")) for r, v in ranks.items()}))
    check(hosts.leftovers() == [], "no namespace left behind")


tmp = tempfile.mkdtemp(prefix="ddp-multihost-")
try:
    main(tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.exit()
