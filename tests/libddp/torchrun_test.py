"""torchrun itself, PyTorch 2.x's (the venv's), launches ddp-trainer and a libddp
program with its defaults: `--standalone` c10d rendezvous on a free port, the agent's
store shared with the ranks (TORCHELASTIC_USE_AGENT_STORE=True). Both train to the
per-step losses of PyTorch's own DDP (both references, within 1e-5), as under ddp.

    <venv>/bin/python torchrun_test.py DDP_TRAINER PARITY_PROGRAM SOURCE_DIR

Run by ctest in the PyPI flavour's build (its torchrun and its LibTorch are one torch).
"""
import json
import os
import subprocess
import sys
import tempfile

trainer, program, source = (os.path.abspath(a) for a in sys.argv[1:4])
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

if failures:
    sys.exit("FAIL:\n  " + "\n  ".join(failures))
import torch  # noqa: E402 (only to name the torchrun that ran)
print("ok: torchrun of torch %s started ddp-trainer and a libddp program to the references' "
      "losses" % torch.__version__)
