"""The multi-host harness itself (tests/multihost/netns.py): what each fault helper does
to the traffic between hosts, and that nothing outlives a run, however it ends.

    python3 tests/multihost/netns_test.py BIN_DIR

- partition(a, b, port=P) stops TCP to P between a and b, and nothing else;
- drop(a, b) is one way: a's datagrams to b are lost, b's to a arrive;
- cut(i) takes host i off the network silently, heal(i) brings it back;
- slow(netem, 20, 0) adds 20 ms each way (a TCP connect takes 40 ms or more), fast()
  takes it away;
- a run ended by SIGTERM removes its namespaces and kills what it started; a run
  killed outright (SIGKILL) leaves namespaces that the next run removes.
Skips (exit 77) where namespaces or iptables are missing.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_on_hosts import Checks  # noqa: E402
from netns import SKIP, Hosts, _ip  # noqa: E402

bindir = os.path.abspath(sys.argv[1])
why = Hosts.unavailable() or Hosts.no_iptables()
if why:
    print("SKIP: " + why)
    sys.exit(SKIP)
check = Checks()

CONNECT = ("import socket, sys, time\nt = time.time()\n"
           "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5)\n"
           "print(time.time() - t)")
LISTEN = ("import socket, sys\ns = socket.socket()\n"
          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind((sys.argv[1], int(sys.argv[2])))\ns.listen(64)\n"
          "while True:\n    s.accept()[0].close()\n")
UDP_RECV = ("import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "s.bind((sys.argv[1], 9999))\ns.settimeout(1.5)\n"
            "try:\n    print(s.recv(100).decode())\nexcept socket.timeout:\n    print('nothing')\n")
UDP_SEND = ("import socket, sys, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "for _ in range(10):\n    s.sendto(b'hello', (sys.argv[1], 9999))\n    time.sleep(0.1)\n")


def connect(hosts, src, dst, port):
    """Seconds a TCP connect from src to dst:port took, or None when it failed."""
    r = hosts.run(src, ["python3", "-c", CONNECT, hosts[dst].addr, str(port)], timeout=10)
    return float(r.stdout) if r.returncode == 0 else None


def datagram(hosts, src, dst):
    """What dst received of src's UDP datagrams ("hello" or "nothing")."""
    recv = subprocess.Popen(hosts.argv(dst, ["python3", "-c", UDP_RECV, hosts[dst].addr]),
                            stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    hosts.run(src, ["python3", "-c", UDP_SEND, hosts[dst].addr])
    return recv.communicate(timeout=10)[0].strip()


def faults():
    with Hosts(3) as hosts:
        for i in range(3):
            for port in (7000, 7001):
                hosts.spawn(i, ["python3", "-c", LISTEN, hosts[i].addr, str(port)])
        for i in range(3):
            hosts.wait_listening((i + 1) % 3, hosts[i].addr, 7001)
        check(connect(hosts, 1, 0, 7000) is not None, "h1 reaches h0")

        hosts.partition(1, 0, port=7000)
        check(connect(hosts, 1, 0, 7000) is None and connect(hosts, 0, 1, 7000) is None,
              "partition(1, 0, port=7000): no connection to port 7000 either way")
        check(connect(hosts, 1, 0, 7001) is not None and connect(hosts, 2, 0, 7000) is not None,
              "... while port 7001, and h2 to h0, still work")
        hosts.heal_links()
        check(connect(hosts, 1, 0, 7000) is not None, "heal_links() undoes it")

        hosts.drop(1, 2)
        check(datagram(hosts, 1, 2) == "nothing" and datagram(hosts, 2, 1) == "hello",
              "drop(1, 2) is one way: h1's datagrams to h2 lost, h2's to h1 arrive")
        hosts.heal_links()

        hosts.cut(2)
        check(connect(hosts, 1, 2, 7000) is None and connect(hosts, 0, 2, 7000) is None,
              "cut(2): nobody reaches h2")
        hosts.heal(2)
        check(connect(hosts, 1, 2, 7000) is not None, "heal(2): back")

        netem = os.path.join(bindir, "ddp-test-netem")
        if not os.path.exists(netem):
            check(False, "ddp-test-netem was built (libnetfilter-queue-dev)")
        else:
            fast = connect(hosts, 1, 0, 7000)
            hosts.slow(netem, 20, 0.0)
            slow = connect(hosts, 1, 0, 7000)
            hosts.fast()
            again = connect(hosts, 1, 0, 7000)
            check(slow is not None and slow >= 0.04 and fast < 0.02 and again < 0.02,
                  "slow(20 ms): a connect takes %.1f ms (%.1f ms before, %.1f ms after fast())"
                  % ((slow or -1) * 1000, fast * 1000, again * 1000))
    check(hosts.leftovers() == [], "no namespace left after the run")


CHILD = """import sys, time
sys.path.insert(0, sys.argv[1])
from netns import Hosts
hosts = Hosts(2)
p = hosts.spawn(1, ["sleep", "1000"])
print(hosts.tag, p.pid, flush=True)
time.sleep(1000)
"""


def ends(sig):
    """A run ended by `sig`: (its namespaces left right after, its sleep's pid)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, os.path.dirname(os.path.abspath(
        __file__))], stdout=subprocess.PIPE, text=True)
    tag, pid = child.stdout.readline().split()
    child.send_signal(sig)
    child.wait(timeout=30)
    left = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if tag in line]
    return left, int(pid)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cleanup():
    left, pid = ends(signal.SIGTERM)
    check(left == [] and not alive(pid),
          "SIGTERM: namespaces removed (%s) and what the run started killed" % left)
    left, pid = ends(signal.SIGKILL)
    check(len(left) == 3, "SIGKILL: the run's 3 namespaces stay behind (%s)" % left)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)  # Its own process group; nobody else would end it.
    with Hosts(1) as hosts:
        remaining = [n for n in left if n in _ip("netns", "list").stdout]
        check(remaining == [], "the next run removed them (%s left)" % remaining)
    check(hosts.leftovers() == [], "and its own")


faults()
cleanup()
check.exit()
