"""torchrun itself, PyTorch 2.x's (the venv's), launches ddp-trainer and libddp
programs with its defaults: `--standalone` c10d rendezvous on a free port, the agent's
store shared with the ranks (TORCHELASTIC_USE_AGENT_STORE=True). ddp-trainer and the
parity program train to the per-step losses of PyTorch's own DDP (both references,
within 1e-5), as under ddp; examples/cpp's program (FASHION_PROGRAM) trains to the
per-step losses it has as a command job on a real ddp cluster (a coordinator and a
worker with 2 slots, on loopback), rank by rank within 1e-5.

    <venv>/bin/python torchrun_test.py DDP_TRAINER PARITY_PROGRAM SOURCE_DIR FASHION_PROGRAM

Run by ctest in the PyPI flavour's build (its torchrun and its LibTorch are one torch).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ddp_test_ports import claim_port  # noqa: E402 (tests/common/ddp_test_ports.py)
import time

trainer, program, source, fashion = (os.path.abspath(a) for a in sys.argv[1:5])
bindir = os.path.dirname(trainer)  # ddp-coordinator, ddp-worker and ddpctl are beside it.
fixtures = os.path.join(source, "tests", "fixtures")
torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
failures = []


def run(argv, cwd, env=None):
    """torchrun --standalone --nproc_per_node=2 --no-python ARGV: the step events by rank."""
    # --tee 1: each rank's stdout, prefixed [default<local rank>]: (a program's event
    # lines need not carry their rank).
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", "--tee", "1", "--no-python"] + argv
    proc = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **(env or {})),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit("FAIL: %s exited %d\n%s\n%s" % (" ".join(cmd), proc.returncode,
                                                 proc.stdout[-4000:], proc.stderr[-4000:]))
    events = {0: [], 1: []}
    for line in proc.stdout.splitlines():
        prefix, _, text = line.partition("]:")
        if prefix.startswith("[default") and text.startswith("{"):
            events[int(prefix[len("[default"):])].append(json.loads(text))
    return events


def near(what, got, want, tol=1e-5):
    if len(got) != len(want):
        failures.append("%s: %d steps, the reference has %d" % (what, len(got), len(want)))
        return
    worst = max((abs(a - b) for a, b in zip(got, want)), default=0.0)
    if worst > tol:
        failures.append("%s: a loss differs by %g" % (what, worst))
    else:
        print("ok: %s: %d steps within %g (worst %.2g)" % (what, len(got), tol, worst))


# ddp-trainer on a parity fixture, from the fixtures' directory (its relative paths).
job = "cancer_adam"
events = run([trainer, "--spec", job + ".yaml"], fixtures)
starts = [e for r in events for e in events[r] if e["type"] == "start"]
if len(starts) != 2:
    failures.append("ddp-trainer: %d start events, not 2" % len(starts))
done = [e for r in (0, 1) for e in events[r] if e["type"] == "done"]
if len(done) != 2 or done[0]["params_fingerprint"] != done[1]["params_fingerprint"]:
    failures.append("ddp-trainer: the ranks did not end on the same parameters: %s" % done)
for ref in (job + ".losses.json", os.path.join("torch2", job + ".losses.json")):
    reference = json.load(open(os.path.join(fixtures, ref)))
    for rank in (0, 1):
        got = [e["loss"] for e in events[rank] if e["type"] == "step"]
        want = [row[2] for row in reference["ranks"][str(rank)]["losses"]]
        near("ddp-trainer rank %d against %s" % (rank, ref), got, want)

# The libddp program of library_parity_test, reporting on stdout.
with tempfile.TemporaryDirectory() as cwd:
    events = run([program], cwd, {"DDP_REPORT_STDOUT": "1"})
for ref in ("libddp_parity.json", os.path.join("torch2", "libddp_parity.json")):
    reference = json.load(open(os.path.join(fixtures, ref)))["world_2"]
    for rank in (0, 1):
        got = [e["loss"] for e in events[rank] if e["type"] == "step"]
        near("libddp program rank %d against %s" % (rank, ref), got, reference[rank]["losses"])



def free_port():
    # A port of this process's own, claimed against tests run beside it (ctest -j).
    return claim_port()


def ddp_command_job(argv, tmp):
    """ARGV as a 2-rank command job on a real local cluster: {rank: [step losses]}."""
    addr = "127.0.0.1:%d" % free_port()
    procs = []
    try:
        for name, cmd in (("coordinator", ["ddp-coordinator", "--listen", addr, "--state-dir",
                                           os.path.join(tmp, "state")]),
                          ("worker", ["ddp-worker", "--coordinator", addr, "--name", "node",
                                      "--slots", "2", "--work-dir", os.path.join(tmp, "work")])):
            log = open(os.path.join(tmp, name + ".log"), "w")
            procs.append(subprocess.Popen([os.path.join(bindir, cmd[0])] + cmd[1:], stdout=log,
                                          stderr=subprocess.STDOUT))

        def ctl(*args):
            r = subprocess.run([os.path.join(bindir, "ddpctl")] + list(args) +
                               ["--coordinator", addr], capture_output=True, text=True)
            return r.stdout if r.returncode == 0 else None

        deadline = time.time() + 60
        while "1 alive" not in (ctl("workers", "--summary") or ""):
            if time.time() > deadline:
                sys.exit("FAIL: the local cluster did not come up")
            time.sleep(0.2)
        spec = os.path.join(tmp, "job.yaml")
        with open(spec, "w") as f:
            f.write("name: fashion-example\nnodes: 1\nnproc_per_node: 2\nworkdir: %s\n"
                    "command: %s\n" % (tmp, json.dumps(argv)))
        job = json.loads(ctl("submit", spec, "-o", "json"))["id"]
        deadline = time.time() + 300
        while True:
            j = json.loads(ctl("get", job, "--history", "-o", "json"))
            if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                break
            if time.time() > deadline:
                sys.exit("FAIL: the command job did not end in 300 s")
            time.sleep(0.5)
        if j["state"] != "SUCCEEDED":
            sys.exit("FAIL: the command job %s: %s\n%s" % (j["state"], j.get("reason"),
                                                          ctl("logs", job) or ""))
        losses = {0: {}, 1: {}}
        for m in j.get("history", []):
            losses[int(m.get("rank", 0))][int(m.get("global_step", 0))] = m["loss"]
        return {r: [losses[r][k] for k in sorted(losses[r])] for r in losses}
    finally:
        for p in reversed(procs):  # The worker first: it stops its ranks.
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# examples/cpp's program (a residual CNN on Fashion-MNIST), under torchrun and under ddp.
fashion_args = ["--data", "/usr/share/datasets/fashion-mnist", "--epochs", "1", "--limit", "512",
                "--batch-size", "32", "--threads", "1"]
with tempfile.TemporaryDirectory() as cwd:
    events = run([fashion] + fashion_args, cwd, {"DDP_REPORT_STDOUT": "1"})
    under_ddp = ddp_command_job([fashion] + fashion_args, cwd)
for rank in (0, 1):
    got = [e["loss"] for e in events[rank] if e["type"] == "step"]
    if not got:
        failures.append("examples/cpp rank %d: no step events under torchrun" % rank)
    near("examples/cpp rank %d under torchrun against the same program as a ddp command job"
         % rank, got, under_ddp[rank])

if failures:
    sys.exit("FAIL:\n  " + "\n  ".join(failures))
import torch  # noqa: E402 (only to name the torchrun that ran)
print("ok: torchrun of torch %s started ddp-trainer and the parity program to the references' "
      "losses, and examples/cpp to its losses under ddp" % torch.__version__)
