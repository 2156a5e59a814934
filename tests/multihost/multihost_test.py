"""ddp across hosts, secured: a coordinator, three workers and a client, each on a host
of its own (network namespaces on one bridge, tests/multihost/netns.py), no loopback
between them, mTLS and tokens with certificates made for the hosts' addresses
(scripts/make_certs.sh --san).

    python3 tests/multihost/multihost_test.py BIN_DIR SOURCE_DIR

- the workers register with their own addresses (--advertise-addr) over mTLS;
- ddpctl runs from a host that is neither the coordinator's nor a worker's;
- a 3-node job of the built-in trainer and a 2-node PyTorch command job (Debian's
  torch, Gloo) train to SUCCEEDED across the hosts: each rank's address is its worker's,
  rank 0's worker hosts the rendezvous (MASTER_ADDR), and the ranks' Gloo listens on the
  hosts' own interface (GLOO_SOCKET_IFNAME from --advertise-addr; this machine's host
  name resolves to loopback, where Gloo would listen otherwise);
- with every link 20 ms slower each way and 1% lossy (ddp-test-netem on NFQUEUE; this
  kernel has no netem), a 2-node job still SUCCEEDS;
- nothing is left behind: processes and namespaces.
Skips (exit 77) where namespaces cannot be made.
"""
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
    with Hosts(5) as hosts:
        names = {1: "w1", 2: "w2", 3: "w3"}
        client = hosts[4]
        # Command jobs are for the `users` role (admin included) here.
        ddp = DdpOnHosts(hosts, bindir, tmp, workers=names, tls=source,
                         coordinator_args=("--command-jobs", "users"),
                         worker_args=("--slots", "1", "--allow-exec", "/usr/bin/python3"))

        def ctl(*args, timeout=60):
            return ddp.ctl(client.index, *args, timeout=timeout)

        ddp.wait_listening(client.index)
        workers = ddp.wait_workers(client.index, names.values())
        addrs = {w["name"]: w.get("address") for w in workers}
        check(addrs == {n: hosts[i].addr for i, n in names.items()},
              "the workers registered over mTLS with their hosts' addresses: %s" % addrs)
        for line in open(ddp.log_path("w1")):
            if "Gloo binds" in line:
                check("eth0" in line, "w1 says where ranks' Gloo binds: " + line.strip())
                break
        else:
            check(False, "w1 says where ranks' Gloo binds")

        data = os.path.join(source, "data", "breast_cancer.csv")
        builtin = os.path.join(tmp, "builtin.yaml")
        with open(builtin, "w") as f:
            f.write("name: across-hosts\nnodes: 3\nnproc_per_node: 1\n"
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
        for spec, nodes in ((builtin, 3), (command, 2)):
            j = ddp.wait_job(client.index, ddp.submit(client.index, spec))
            what = os.path.basename(spec)
            check(j["state"] == "SUCCEEDED", "%s across hosts: %s %s" % (what, j["state"],
                                                                       j.get("reason", "")))
            if j["state"] != "SUCCEEDED":
                print(ctl("logs", j["id"]))
            ranks = {int(r.get("rank", 0)): r for a in j.get("attempts", [])[-1:]
                     for r in a.get("ranks", [])}
            where = {ranks[r].get("address") for r in ranks}
            check(sorted(ranks) == list(range(nodes)) and len(where) == nodes and
                  where <= {hosts[i].addr for i in names},
                  "%s: each rank on a host of its own: %s" % (
                      what, {r: (v.get("worker"), v.get("address")) for r, v in ranks.items()}))
        slow_links(hosts, ddp, client, data)
    check(hosts.leftovers() == [], "no namespace left behind")


def slow_links(hosts, ddp, client, data):
    """Every link 20 ms slower each way and 1% lossy (ddp-test-netem): a 2-node job still
    SUCCEEDS."""
    netem = os.path.join(bindir, "ddp-test-netem")
    why = Hosts.no_iptables() or (None if os.path.exists(netem) else
                                  "no ddp-test-netem (built with libnetfilter-queue-dev)")
    if why:
        print("skipped, slow links: " + why)
        return
    spec = os.path.join(os.path.dirname(ddp.log_path("x")), "slow.yaml")
    with open(spec, "w") as f:
        f.write("name: slow-links\nnodes: 2\nnproc_per_node: 1\n"
                "model: {mlp: {hidden: [16]}}\n"
                "data: {csv: {path: %s, skip_rows: 1, label_column: -1, standardize: true}}\n"
                "train: {epochs: 1, batch_size: 16, optimizer: {name: adam, lr: 0.001}}\n" % data)
    hosts.slow(netem, 20, 0.01, seed=30)
    probe = ("import socket, sys, time\nt = time.time()\n"
             "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
             "print(time.time() - t)")
    r = hosts.run(client.index, ["python3", "-c", probe, ddp.coordinator.addr, "7700"])
    rtt = float(r.stdout or "0")
    check(rtt >= 0.04, "slow links: a TCP connect takes %.0f ms (20 ms each way)" % (rtt * 1000))
    t0 = time.time()
    j = ddp.wait_job(client.index, ddp.submit(client.index, spec), timeout=300)
    check(j["state"] == "SUCCEEDED", "slow links (20 ms, 1%% loss): %s %s in %.1f s" % (
        j["state"], j.get("reason", ""), time.time() - t0))
    hosts.fast()


tmp = tempfile.mkdtemp(prefix="ddp-multihost-")
try:
    main(tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.exit()
