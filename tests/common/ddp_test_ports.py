"""Ports for tests that run side by side (ctest -j; docs/testing.md): Python's half of
tests/common/ports.h, on the same lock files.

A port picked by binding to 0 and closing the socket can be taken before the server it
is meant for binds it: by another test's server, or by an outgoing connection, whose
local port the kernel draws from the same ephemeral range. So tests take their ports
from blocks of 16 below the ephemeral range (and above it), each block claimed by the
process for as long as it lives with an flock()ed file under /tmp/ddp-test-ports/ (the
lock goes with the process however it ends). A port is handed out at most once per
process, so a server restarted on its port never meets another's.

    sys.path.insert(0, "<repo>/tests/common"); from ddp_test_ports import claim_port
"""
import fcntl
import os
import random
import socket
import threading

BLOCK = 16
LOCK_DIR = "/tmp/ddp-test-ports"
LOWEST = 20000

_lock = threading.Lock()
_claims = []  # open files: the claims, held until the process ends
_next = 0
_end = 0
_starts = None
_cursor = 0


def _block_starts():
    lo, hi = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        pass
    starts = list(range(LOWEST, lo - BLOCK + 1, BLOCK))
    starts += list(range(max(hi + 1, LOWEST), 65536 - BLOCK + 1, BLOCK))
    return starts


def _bindable(addr, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
            return True
        except OSError:
            return False


def _free(port):
    return _bindable("0.0.0.0", port) and _bindable("127.0.0.1", port)


def _claim_locked():
    global _starts, _cursor
    if _starts is None:
        _starts = _block_starts()
        if not _starts:
            raise RuntimeError("no ports for tests outside the kernel's ephemeral range "
                               "(/proc/sys/net/ipv4/ip_local_port_range)")
        _cursor = random.SystemRandom().randrange(len(_starts))
        os.makedirs(LOCK_DIR, exist_ok=True)
        try:
            os.chmod(LOCK_DIR, 0o1777)  # Every user's tests share the claims.
        except OSError:
            pass
    for _ in range(len(_starts)):
        start = _starts[_cursor]
        _cursor = (_cursor + 1) % len(_starts)
        path = os.path.join(LOCK_DIR, "block-%d.lock" % start)
        try:
            f = open(path, "a+")
        except OSError:
            continue
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        try:
            os.chmod(path, 0o666)
        except OSError:
            pass
        _claims.append(f)
        return start
    raise RuntimeError("every block of test ports in %s is claimed by another process" % LOCK_DIR)


def claim_port(taken=None):
    """A port of this process's blocks that nothing binds now and that this process has
    not handed out before; added to `taken` (a set) when one is given."""
    global _next, _end
    with _lock:
        for _ in range(64):
            while _next < _end:
                port = _next
                _next += 1
                if _free(port):
                    if taken is not None:
                        taken.add(port)
                    return port
            _next = _claim_locked()
            _end = _next + BLOCK
    raise RuntimeError("no free port in 64 claimed blocks of test ports")


def claim_port_block():
    """(first, count): a whole block of this process's own, none of whose ports
    claim_port hands out, for a program that picks its ports itself (ddp-worker's
    --store-ports)."""
    with _lock:
        return _claim_locked(), BLOCK


if __name__ == "__main__":
    # `ddp_test_ports.py starts`: the first port of every block, one a line, for a shell
    # script that claims a block itself (flock on LOCK_DIR/block-FIRST.lock, held by an
    # open file descriptor for the script's life; tests/common/claim_ports.sh).
    import sys
    if sys.argv[1:] != ["starts"]:
        sys.exit("usage: ddp_test_ports.py starts")
    print("\n".join(str(s) for s in _block_starts()))
