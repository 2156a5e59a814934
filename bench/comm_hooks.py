#!/usr/bin/python3
"""Benchmark: communication hooks, libddp against PyTorch's DDP with the same hook.

    /usr/bin/python3 bench/comm_hooks.py [--repeats 3] [--steps 300]
                                        [--out bench/results/comm_hooks.json]
    /usr/bin/python3 bench/comm_hooks.py --link 1,1000 --link 5,100 [--steps 100]
                                        [--out bench/results/comm_hooks_link.json]

bench/jobs/mlp85k.yaml's model (64-256-256-10 MLP, 85,002 parameters, Adam, batch 32 per
rank, one intra-op thread), 2 ranks on this machine, with no hook, fp16_compress_hook and
powerSGD_hook (rank 1 after 10 plain iterations): libddp (build/bin/ddp-bench-comm-hooks)
and PyTorch 1.13's Python DDP (bench/comm_hooks_pytorch.py, Debian's torch, Gloo). Per
side and hook: the median step time of rank 0 (after 10 warm-up steps; the median over
--repeats runs) and the bytes each rank all-reduced per step (libddp's
BackwardStats::allreduce_bytes; PyTorch: what the hook passed to dist.all_reduce, and
for no hook the gradients' size).

With --link DELAY_MS,MBIT (root; repeatable), the two ranks run on two hosts of the
multi-host harness (tests/multihost/netns.py: network namespaces on a bridge), one rank
per host, so the gradients cross a real TCP link (Gloo on both sides; GLOO_SOCKET_IFNAME
eth0): every packet a host sends is held DELAY_MS by ddp-test-netem (the harness's
NFQUEUE stand-in for netem, which this kernel lacks) and each host's egress is limited
to MBIT Mbit/s by a tbf qdisc. Each link setting is measured for every hook on both
sides, in one run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from benchkit import free_port  # noqa: E402  (bench/benchkit.py: the tests' ports)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "multihost"))
BIN = os.path.join(ROOT, "build", "bin")
WORLD = 2
PARAMS = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10


def run_ranks(argv, hosts=None):
    """Runs argv as WORLD ranks (torchrun's environment) and returns rank 0's JSON line:
    on this machine, or with `hosts` (netns.Hosts) one rank on each host, across its
    links (Gloo on eth0)."""
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        if hosts is None:
            env.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        else:
            env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank),
                       MASTER_ADDR=hosts[0].addr, MASTER_PORT="29511", GLOO_SOCKET_IFNAME="eth0")
        env.pop("DDP_EVENTS_FD", None)
        procs.append(subprocess.Popen(argv if hosts is None else hosts.argv(rank, argv), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"{argv} failed ({p.returncode}):\n{err.decode()[-2000:]}")
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return outs[0]


def measure(a, run):
    """Every hook on both sides, alternating who goes first: {hook: {side: ...}}."""
    hooks = {}
    for hook in ("none", "fp16", "powersgd"):
        runs = {"libddp": [], "pytorch": []}
        for r in range(a.repeats):
            sides = ["libddp", "pytorch"] if r % 2 == 0 else ["pytorch", "libddp"]
            for side in sides:
                argv = ([os.path.join(a.bin, "ddp-bench-comm-hooks"), hook, str(a.steps)]
                        if side == "libddp" else
                        [a.python, os.path.join(ROOT, "bench", "comm_hooks_pytorch.py"),
                         hook, str(a.steps)])
                runs[side].append(run(argv))
        entry = {}
        for side, rs in runs.items():
            entry[side] = {"step_ms": statistics.median(x["step_ms"] for x in rs),
                           "bytes": rs[-1]["bytes"] or (PARAMS * 4 if hook == "none" else 0)}
        hooks[hook] = entry
        print(hook, json.dumps(entry), flush=True)
    return hooks


def linked(a, delay_ms, mbit):
    """measure() with the ranks on two namespaced hosts joined by a slowed link."""
    from netns import Hosts  # noqa: E402 (tests/multihost)
    why = Hosts.unavailable() or Hosts.no_iptables()
    if why:
        sys.exit("--link: " + why)
    with Hosts(WORLD) as hosts:
        if delay_ms > 0:
            hosts.slow(os.path.join(a.bin, "ddp-test-netem"), delay_ms)
        hosts.limit(mbit)
        return measure(a, lambda argv: run_ranks(argv, hosts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--link", action="append", default=[], metavar="DELAY_MS,MBIT",
                    help="run across a slowed link between two namespaced hosts")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="the Python whose torch runs PyTorch's side")
    ap.add_argument("--bin", default=BIN,
                    help="where ddp-bench-comm-hooks is (build-torch2/bin with --python "
                         ".venv-torch2/bin/python: both sides on PyTorch 2.x)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    result = {"world": WORLD, "params": PARAMS, "steps": a.steps, "python": a.python}
    if not a.link:
        result["hooks"] = measure(a, run_ranks)
    else:
        result["links"] = []
        for link in a.link:
            delay_ms, mbit = (int(v) for v in link.split(","))
            print(f"link: +{delay_ms} ms each way, {mbit} Mbit/s", flush=True)
            result["links"].append({"delay_ms": delay_ms, "mbit": mbit,
                                    "hooks": linked(a, delay_ms, mbit)})
    a.out = a.out or os.path.join(ROOT, "bench", "results",
                                  "comm_hooks_link.json" if a.link else "comm_hooks.json")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
