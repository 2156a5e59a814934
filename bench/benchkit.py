"""What bench/'s scripts share with the tests, from where the tests keep it.

Ports: tests/common/ddp_test_ports.py's, below (and above) the ephemeral range, each
claimed for as long as the process lives with a lock file, so a bench run beside the
tests (or beside another bench) never gets a port someone else is about to bind. A port
picked by binding to 0 and closing the socket can be taken meanwhile by any outgoing
connection, and a closed ephemeral port on loopback can "accept" by TCP self-connect.

Clusters: tests/python/ddp_cluster.py's Cluster (a coordinator and N workers on
loopback, stopped and removed by stop()), with the coordinator's and the workers' own
timings (`heartbeats="default"`), as a user runs them: cluster(N) starts one from
build/bin.

    from benchkit import cluster, free_port   # bench/ is the script's own directory
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests", "common"))
sys.path.insert(0, os.path.join(_ROOT, "tests", "python"))
from ddp_cluster import Cluster  # noqa: E402
from ddp_test_ports import claim_port  # noqa: E402

BIN = os.path.join(_ROOT, "build", "bin")


def free_port(taken=None):
    """A port of this process's own; added to `taken` when given."""
    return claim_port(taken if taken is not None else set())


def cluster(workers, bin_dir=BIN, **options):
    """A started Cluster of `workers` workers from `bin_dir`, with default timings;
    `options` as Cluster's (worker_flags, names, dir, ...)."""
    return Cluster(bin_dir, _ROOT, workers, heartbeats="default", **options).start()
