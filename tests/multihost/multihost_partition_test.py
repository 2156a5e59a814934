"""A worker cut off from the network and back: the coordinator declares it lost, and once
the cut heals the worker is back within seconds, whatever the cut's length, and says so.

    python3 tests/multihost/multihost_partition_test.py BIN_DIR [CUT_SECONDS]

A coordinator and two workers on hosts of their own (tests/multihost/netns.py, no
loopback between them); w2's switch port goes down for CUT_SECONDS (default 20, four
times the heartbeat timeout) and comes back. Skips (exit 77) where namespaces cannot be
made. Prints the times: lost declared after N s, back after M s.
"""
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import SKIP, Hosts  # noqa: E402

bindir = os.path.abspath(sys.argv[1])
cut_s = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
# Past this after the heal the worker counts as not back: a bound for the test's sake,
# far above what it takes (a second or two), far below what TCP's own retransmission
# back-off took before the keepalive (11.6 s after a 15 s cut, over 42 s after 60 s).
BACK_WITHIN_S = 10.0
why = Hosts.unavailable()
if why:
    print("SKIP: " + why)
    sys.exit(SKIP)
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def main(tmp):
    with Hosts(3) as hosts:
        coord = hosts[0]
        addr = "%s:7700" % coord.addr
        hosts.spawn(0, [os.path.join(bindir, "ddp-coordinator"), "--listen", addr,
                        "--state-dir", os.path.join(tmp, "state"), "--insecure"],
                    log=os.path.join(tmp, "coordinator.log"))
        for i, name in ((1, "w1"), (2, "w2")):
            hosts.spawn(i, [os.path.join(bindir, "ddp-worker"), "--coordinator", addr,
                            "--name", name, "--advertise-addr", hosts[i].addr,
                            "--work-dir", os.path.join(tmp, "work-" + name)],
                        log=os.path.join(tmp, name + ".log"))

        def alive():
            r = hosts.run(1, [os.path.join(bindir, "ddpctl"), "workers", "-o", "json",
                              "--coordinator", addr], timeout=10)
            if r.returncode != 0:
                return None
            ws = json.loads(r.stdout)
            ws = ws.get("workers", ws) if isinstance(ws, dict) else ws
            return {w["name"] for w in ws if w.get("alive")}

        def wait(pred, timeout):
            t0 = time.time()
            while time.time() - t0 < timeout:
                a = alive()
                if a is not None and pred(a):
                    return time.time() - t0
                time.sleep(0.1)
            return None

        hosts.wait_listening(1, coord.addr, 7700)
        check(wait(lambda a: a == {"w1", "w2"}, 60) is not None, "both workers registered")
        hosts.cut(2)
        lost = wait(lambda a: "w2" not in a, cut_s)
        check(lost is not None, "w2 declared lost %.1f s after the cut" % (lost or -1))
        time.sleep(max(0.0, cut_s - (lost or cut_s)))
        hosts.heal(2)
        healed = time.time()
        back = wait(lambda a: "w2" in a, 60)
        check(back is not None and back <= BACK_WITHIN_S,
              "w2 back %.1f s after a %.0f s cut healed (at most %.0f s)"
              % (back if back is not None else -1, cut_s, BACK_WITHIN_S))
        log = open(os.path.join(tmp, "w2.log")).read()
        check("reachable again" in log, "w2's log says the coordinator is reachable again")
        del healed
    check(hosts.leftovers() == [], "no namespace left behind")


tmp = tempfile.mkdtemp(prefix="ddp-partition-")
try:
    main(tmp)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
if failures:
    sys.exit("FAIL:\n  " + "\n  ".join(failures))
print("PASS")
