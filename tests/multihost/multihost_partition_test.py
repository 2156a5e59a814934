"""A worker cut off from the network and back: the coordinator declares it lost, and once
the cut heals the worker is back within seconds, whatever the cut's length, and says so.

    python3 tests/multihost/multihost_partition_test.py BIN_DIR [CUT_SECONDS]

A coordinator and two workers on hosts of their own (tests/multihost/netns.py, no
loopback between them); w2's switch port goes down for CUT_SECONDS (default 20, four
times the heartbeat timeout) and comes back. Skips (exit 77) where namespaces cannot be
made. Prints the times: lost declared after N s, back after M s.
"""
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_on_hosts import Checks, DdpOnHosts  # noqa: E402
from netns import SKIP, Hosts  # noqa: E402

bindir = os.path.abspath(sys.argv[1])
cut_s = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
# Past this after the heal the worker counts as not back: a bound for the test's sake,
# far above what it takes (under a second here), far below what TCP's own retransmission
# back-off took before the keepalive (7.6 s after a 20 s cut here; issue 30 saw 11.6 s
# after a 15 s cut and over 42 s after a 60 s one).
BACK_WITHIN_S = 10.0
why = Hosts.unavailable()
if why:
    print("SKIP: " + why)
    sys.exit(SKIP)
check = Checks()


def main(tmp):
    with Hosts(3) as hosts:
        ddp = DdpOnHosts(hosts, bindir, tmp, workers={1: "w1", 2: "w2"})

        def wait(pred, timeout):
            t0 = time.time()
            while time.time() - t0 < timeout:
                a = ddp.alive(1)
                if a is not None and pred(a):
                    return time.time() - t0
                time.sleep(0.1)
            return None

        ddp.wait_listening(1)
        check(wait(lambda a: a == {"w1", "w2"}, 60) is not None, "both workers registered")
        hosts.cut(2)
        lost = wait(lambda a: "w2" not in a, cut_s)
        check(lost is not None, "w2 declared lost %.1f s after the cut" % (lost or -1))
        time.sleep(max(0.0, cut_s - (lost or cut_s)))
        hosts.heal(2)
        back = wait(lambda a: "w2" in a, 60)
        check(back is not None and back <= BACK_WITHIN_S,
              "w2 back %.1f s after a %.0f s cut healed (at most %.0f s)"
              % (back if back is not None else -1, cut_s, BACK_WITHIN_S))
        log = open(ddp.log_path("w2")).read()
        check("reachable again" in log, "w2's log says the coordinator is reachable again")
    check(hosts.leftovers() == [], "no namespace left behind")


tmp = tempfile.mkdtemp(prefix="ddp-partition-")
try:
    main(tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.exit()
