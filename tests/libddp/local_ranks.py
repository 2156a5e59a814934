"""The parity tests' launcher: a program run as the ranks of one process group on this
machine, with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR, MASTER_PORT).

    outs = run_ranks([program, *args], world=2, prefix="zero-parity-", dir_flag="--dir")
    for returncode, stdout, stderr in outs: ...
    want = run_reference("zero_reference.py", 2, "sgd,adam")   # PyTorch's JSON
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ddp_test_ports import claim_port  # noqa: E402 (tests/common/ddp_test_ports.py)

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    # A port of this process's own, claimed against tests run beside it (ctest -j).
    return claim_port()


def run_ranks(argv, world, prefix="ddp-ranks-", timeout=240, dir_flag=None):
    """Starts argv as ranks 0..world-1, each in a fresh temporary directory shared by all
    (their cwd, and given as `dir_flag DIR` when dir_flag is set), and waits for every
    one: a (returncode, stdout, stderr) per rank, in rank order. Ranks still running when
    the wait ends (a timeout raises subprocess.TimeoutExpired) are killed; the directory
    is removed."""
    port = free_port()
    procs = []
    with tempfile.TemporaryDirectory(prefix=prefix) as cwd:
        extra = [dir_flag, cwd] if dir_flag else []
        try:
            for rank in range(world):
                env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                           WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                procs.append(subprocess.Popen(list(argv) + extra, env=env, cwd=cwd,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True))
            outs = []
            for p in procs:
                out, err = p.communicate(timeout=timeout)
                outs.append((p.returncode, out, err))
            return outs
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def run_reference(script, *args, timeout=300):
    """Runs this directory's PyTorch reference `script` with `args` under this Python (the
    flavour's torch) and returns the JSON it prints; fails with its stderr otherwise."""
    out = subprocess.run([sys.executable, os.path.join(HERE, script), *map(str, args)],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def assert_close(test, got, want, exact, tolerance, where):
    """Asserts `got` equals `want` element by element (bit for bit when `exact`, else
    within `tolerance` relative to max(1, |want|)); returns the largest difference."""
    test.assertEqual(len(got), len(want), where)
    for k, (g, w) in enumerate(zip(got, want)):
        if exact:
            test.assertEqual(g, w, f"{where}[{k}]")
        else:
            test.assertLessEqual(abs(g - w), tolerance * max(1.0, abs(w)), f"{where}[{k}]")
    return max((abs(g - w) for g, w in zip(got, want)), default=0.0)
