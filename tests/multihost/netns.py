"""Test hosts as Linux network namespaces: a multi-host harness for ddp's tests.

    with Hosts(3) as hosts:            # h0, h1, h2: 10.<a>.<b>.1, .2, .3 on one bridge
        p = hosts.spawn(1, ["ddp-worker", ...], log="w1.log")
        hosts.run(2, ["ddpctl", "get", ...])
        hosts[1].addr                    # "10.<a>.<b>.2"
    hosts.cut(2); ...; hosts.heal(2)    # host 2 off the network, silently, and back
    hosts.partition(1, 0, port=7700)    # 1 <-> 0 lost, only what goes to/from port 7700
    hosts.partition(1, 2, oneway=True)  # what 1 sends to 2 is lost; 2 -> 1 still flows
    hosts.heal_links()                  # every partition() undone
    hosts.slow(netem, 20, 0.01, seed)   # every host's egress: +20 ms, 1% lost
    hosts.limit(100)                    # every host's egress: at most 100 Mbit/s

Each host is a namespace of its own with loopback and one veth ("eth0"), whose other end
is a port of a bridge inside a further namespace (the switch), so nothing of the
machine's own network is touched, and every address is one the test assigned: traffic
goes only between these hosts. Names carry a per-run tag, so runs in parallel do not
meet. Everything is removed on exit from the `with` block, on SIGTERM/SIGINT, and at
interpreter exit: the processes started through spawn() (each in a process group of
its own, killed with it), then the namespaces (which takes their links along). A run
killed outright (SIGKILL) leaves its namespaces, named with its pid; the next run
removes those of processes that are gone.

Partitions are iptables rules (DROP, silent) in the sending host's namespace; slow
links hand each host's outgoing packets to NFQUEUE, served by ddp-test-netem
(tests/multihost/netem_queue.cc) in that namespace. Needs root and iproute2;
`Hosts.unavailable()` says why not, for a test to skip on, and `Hosts.no_iptables()`
for the tests that partition or slow links.
"""
import atexit
import os
import random
import re
import signal
import subprocess
import time

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests.


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


_NAME = re.compile(r"^ddp(?:sw|h\d+)-(\d+)-[0-9a-f]+$")


def _sweep_orphans():
    """Removes the namespaces of earlier runs whose process is gone."""
    listing = _ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not os.path.exists("/proc/%s" % m.group(1)):
            _ip("netns", "del", name, check=False)


class Host:
    def __init__(self, ns, addr, index):
        self.ns, self.addr, self.index = ns, addr, index


class Hosts:
    @staticmethod
    def unavailable():
        """Why namespaces cannot be made here, or None."""
        if os.geteuid() != 0:
            return "network namespaces need root (ip netns add)"
        if subprocess.run(["which", "ip"], capture_output=True).returncode != 0:
            return "iproute2's ip is not installed"
        tag = "ddpprobe%d" % os.getpid()
        r = _ip("netns", "add", tag, check=False)
        if r.returncode != 0:
            return "ip netns add failed: " + r.stderr.strip()
        _ip("netns", "del", tag, check=False)
        return None

    @staticmethod
    def no_iptables():
        """Why partition() and slow() cannot work here, or None."""
        if subprocess.run(["which", "iptables"], capture_output=True).returncode != 0:
            return "iptables is not installed (Debian's iptables package)"
        return None

    def __init__(self, n):
        _sweep_orphans()
        # The creating process's pid is in every name: a run killed with SIGKILL (which
        # no handler sees) leaves namespaces that the next run removes (_sweep_orphans).
        self.tag = "%d-%x" % (os.getpid(), random.getrandbits(16))
        # A /24 per run: 10.<a>.<b>.0/24, hosts .1 .. .n.
        a, b = 100 + random.randrange(100), random.randrange(256)
        self.prefix = "10.%d.%d" % (a, b)
        self.switch = "ddpsw-" + self.tag
        self.hosts = []
        self.procs = []
        self.netems = []
        self._cut_chains = set()
        self._closed = False
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self._make(n)
        except BaseException:
            self.close()
            raise

    def _on_signal(self, signum, frame):
        self.close()
        raise SystemExit(128 + signum)

    def _make(self, n):
        _ip("netns", "add", self.switch)
        self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.switch, "ip", "link", "set", "br0", "up")
        for i in range(n):
            ns = "ddph%d-%s" % (i, self.tag)
            _ip("netns", "add", ns)
            self.hosts.append(Host(ns, "%s.%d" % (self.prefix, i + 1), i))
            port = "p%d" % i
            # The veth is made inside the host's namespace, its peer moved to the switch.
            self._in(ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", port)
            self._in(ns, "ip", "link", "set", port, "netns", self.switch)
            self._in(self.switch, "ip", "link", "set", port, "master", "br0")
            self._in(self.switch, "ip", "link", "set", port, "up")
            self._in(ns, "ip", "addr", "add", self.hosts[-1].addr + "/24", "dev", "eth0")
            self._in(ns, "ip", "link", "set", "eth0", "up")
            self._in(ns, "ip", "link", "set", "lo", "up")
        # A bridge without STP forwards at once; a test waits for its own services
        # (wait_listening) rather than for the links.

    def _in(self, ns, *argv):
        subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True)

    def __getitem__(self, i):
        return self.hosts[i]

    def __len__(self):
        return len(self.hosts)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def argv(self, i, argv):
        return ["ip", "netns", "exec", self.hosts[i].ns, *argv]

    def spawn(self, i, argv, log=None, env=None):
        """Starts argv on host i (in a process group of its own); output to `log`."""
        out = open(log, "w") if log else subprocess.DEVNULL
        p = subprocess.Popen(self.argv(i, argv), stdout=out, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def run(self, i, argv, timeout=60, env=None):
        """Runs argv on host i to its end: the CompletedProcess (text, not checked)."""
        return subprocess.run(self.argv(i, argv), capture_output=True, text=True,
                              timeout=timeout, env=env)

    def wait_listening(self, i, addr, port, timeout=30):
        """Waits until a TCP connect from host i to addr:port succeeds."""
        probe = ("import socket, sys\n"
                 "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)")
        deadline = time.time() + timeout
        while time.time() < deadline:
            if subprocess.run(self.argv(i, ["python3", "-c", probe, addr, str(port)]),
                              capture_output=True).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError("host %d: nothing listens on %s:%d after %d s" % (i, addr, port, timeout))

    def cut(self, i):
        """Cuts host i off from every other host, both ways, silently: its switch port
        leaves the bridge, while both ends of its link stay up (no carrier loss the host
        could notice), so what it sends is lost, as behind a failed switch or a firewall
        that drops. Its processes and connections live on."""
        self._in(self.switch, "ip", "link", "set", "p%d" % i, "nomaster")

    def heal(self, i):
        """Undoes cut(i)."""
        self._in(self.switch, "ip", "link", "set", "p%d" % i, "master", "br0")

    def drop(self, src, dst, port=None):
        """Packets from host src to host dst are lost from now on, silently (the sender
        sees no error, as behind a firewall that drops). With `port`, only TCP to or
        from that port: between a worker and the coordinator's port, the control plane
        alone."""
        ns = self.hosts[src].ns
        if src not in self._cut_chains:
            # A chain of their own, first in OUTPUT: heal_links() empties it, and a drop
            # comes before slow()'s queue.
            self._in(ns, "iptables", "-N", "ddpcut")
            self._in(ns, "iptables", "-I", "OUTPUT", "1", "-j", "ddpcut")
            self._cut_chains.add(src)
        rule = ["-d", self.hosts[dst].addr]
        for match in (["-p", "tcp", "--dport", str(port)], ["-p", "tcp", "--sport", str(port)]) \
                if port else ([],):
            self._in(ns, "iptables", "-A", "ddpcut", *rule, *match, "-j", "DROP")

    def partition(self, a, b, port=None, oneway=False):
        """Cuts a from b: both ways, or only a -> b with oneway. `port` as in drop()."""
        self.drop(a, b, port)
        if not oneway:
            self.drop(b, a, port)

    def heal_links(self):
        """Undoes every drop() and partition()."""
        for i in self._cut_chains:
            self._in(self.hosts[i].ns, "iptables", "-F", "ddpcut")

    def slow(self, netem, delay_ms, loss=0.0, seed=1, hosts=None):
        """Every packet a host sends (to the other hosts) is held `delay_ms` and lost with
        probability `loss`: so every link, both ways, is that slow and lossy. `netem` is
        the ddp-test-netem binary; `hosts`: the indexes (default all). Until fast()."""
        for i in (range(len(self.hosts)) if hosts is None else hosts):
            h = self.hosts[i]
            p = self.spawn(i, [netem, "--queue", "0", "--delay-ms", str(delay_ms),
                               "--loss", str(loss), "--seed", str(seed + i)])
            self.netems.append((i, p))
            # Only once the queue is served (bypass would let packets through untouched
            # until then: a link that is fast for its first moments).
            time.sleep(0.2)
            if p.poll() is not None:
                raise RuntimeError("ddp-test-netem on host %d exited %s" % (i, p.returncode))
            self._in(h.ns, "iptables", "-A", "OUTPUT", "-o", "eth0", "-j", "NFQUEUE",
                     "--queue-num", "0", "--queue-bypass")

    def limit(self, mbit, hosts=None):
        """Every host's egress (eth0) at most `mbit` Mbit/s: a token bucket (tbf, bursts
        of 64 KiB, packets queued up to 200 ms, then dropped). `hosts`: the indexes
        (default all). It goes with the namespaces."""
        for i in (range(len(self.hosts)) if hosts is None else hosts):
            self._in(self.hosts[i].ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                     "rate", "%dmbit" % mbit, "burst", "64kb", "latency", "200ms")

    def fast(self):
        """Undoes slow(): the queue rules go, then their servers."""
        for i, p in self.netems:
            self._in(self.hosts[i].ns, "iptables", "-D", "OUTPUT", "-o", "eth0", "-j", "NFQUEUE",
                     "--queue-num", "0", "--queue-bypass")
            self.stop(p, timeout=5)
        self.netems = []

    def stop(self, p, timeout=30):
        """SIGTERM to p's process group, SIGKILL after `timeout`."""
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass

    def close(self):
        if self._closed:
            return
        self._closed = True
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for h in self.hosts:
            _ip("netns", "del", h.ns, check=False)
        _ip("netns", "del", self.switch, check=False)

    def leftovers(self):
        """Namespaces of this run still present (none after close())."""
        names = _ip("netns", "list", check=False).stdout
        return [line.split()[0] for line in names.splitlines() if self.tag in line]
