"""The GPU parity check: ddp-trainer against PyTorch's own DDP on the GPU, step by step.

    python3 bench/gpu/parity.py --build BUILD_DIR --out OUT_DIR [--python PY] [--dry-run]

For tests/fixtures/synthetic_bf16.yaml (an MLP on synthetic data, Adam, 2 epochs) in fp32
and in `train.precision: bf16`, on the GPU (`train.device: cuda`) over NCCL at world 1
and over Gloo's CUDA path at world 2 (the one GPU), it runs ddp-trainer and
scripts/pytorch_ddp_reference.py (PyTorch's DistributedDataParallel on the same job:
the same initial weights, sampler, batches, optimizer, and torch.autocast("cuda",
torch.bfloat16) for bf16) and holds every rank's per-step losses and every epoch's
validation loss to PyTorch's within TOLERANCE (relative to max(1, |loss|)). It also
checks that bf16 took effect: its losses leave fp32's by more than 1e-4. Results:
OUT_DIR/gpu_parity.json and OUT_DIR/gpu_parity.md.

It also holds model.gpt (a small GPT-2 on byte-level tokens of the repository's docs,
scripts/make_tokens.py) to nanoGPT's GPT under PyTorch's DDP (tests/reference/nanogpt.py,
through the same reference script), in fp32 within GPT_TOLERANCE and in bf16 within what
bf16 allows (the distance of bf16 from fp32, on both sides, is the measure), and the
whole-step CUDA graph (train.cuda_graph, docs/trainer.md) to the same step run eagerly:
the MLP job and the GPT job with cuda_graph true against false, per step, and the log must
say the step was captured.

--dry-run does the same on the CPU (Gloo, world 2 only): what CI runs where no GPU is;
there, instead of the graphs, cuda_graph: true must be refused (exit 2, naming it).
--parts (default mlp,gpt,graphs) and --configs (default nccl-w1,gloo-w2) pick what runs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench import run_ranks  # noqa: E402

# Measured 0 on an H100 and on the CPU (torch 2.11): any drift in the arithmetic shows in
# bf16 as a jump of a bf16 rounding step (1e-4 and more), so the bound is tight.
TOLERANCE = {"fp32": 1e-6, "bf16": 1e-6}
CONFIGS = {"nccl-w1": ("nccl", 1), "gloo-w2": ("gloo", 2)}
# The bound for the GPT in fp32 (kernels of another order on the GPU: cuBLAS,
# SDPA); bf16 is held to a fraction of its own distance from fp32.
GPT_TOLERANCE = 1e-5
GPT_JOB = """name: gpu-parity-gpt
model: {{gpt: {{layers: 2, heads: 4, dim: 128, seq_len: 64, vocab: 256, dropout: 0, tie_weights: true}}}}
data:
  tokens: {{path: {tokens}/train.bin}}
  validation: {{tokens: {{path: {tokens}/val.bin}}}}
backend: {backend}
train:
  batch_size: 8
  drop_last: true
  max_steps: {steps}
  threads: 1
  device: {device}
  intra_node_comm: gloo
  precision: {precision}
  cuda_graph: {graph}
  optimizer: {{name: adamw, lr: 0.003, weight_decay: 0.1, betas: [0.9, 0.95], weight_decay_params: matrices}}
  lr_schedule: {{name: cosine, warmup: 5, eta_min: 0.0003}}
  clip_grad_norm: 1.0
  seed: 11
"""


def write_job(path, backend, device, precision, graph="auto"):
    with open(os.path.join(ROOT, "tests", "fixtures", "synthetic_bf16.yaml")) as f:
        spec = yaml.safe_load(f)
    spec["name"] = f"gpu-parity-{backend}-{precision}"
    spec["backend"] = backend
    spec["train"].update(precision=precision, device=device, intra_node_comm="gloo",
                         cuda_graph=graph)
    with open(path, "w") as f:
        yaml.safe_dump(spec, f, sort_keys=False)


def write_gpt_job(path, tokens, backend, device, precision, graph="auto", steps=40):
    with open(path, "w") as f:
        f.write(GPT_JOB.format(tokens=tokens, backend=backend, device=device,
                               precision=precision, graph=graph, steps=steps))


def make_tokens(python, tmp):
    """Byte-level token files of the repository's docs (on any machine the tree is)."""
    out = os.path.join(tmp, "tokens")
    docs = sorted(os.path.join(ROOT, "docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                  if n.endswith(".md"))
    subprocess.run([python, os.path.join(ROOT, "scripts", "make_tokens.py"), "--out", out]
                   + docs, check=True, stdout=subprocess.DEVNULL)
    return out


def trainer_run(build, job, world, env, tmp, errs=None):
    outs = run_ranks(lambda r: [os.path.join(build, "bin", "ddp-trainer"), "--spec", job],
                     world, env, tmp, 300, errs)
    ranks = []
    for out in outs:
        events = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        ranks.append({"start": next((e for e in events if e.get("type") == "start"), {}),
                      "losses": [e["loss"] for e in events if e.get("type") == "step"],
                      "val_losses": [e["val_loss"] for e in events
                                     if e.get("type") == "epoch" and "val_loss" in e]})
    return ranks


def reference_run(python, job, world, tmp):
    out = os.path.join(tmp, "reference.json")
    subprocess.run([python, os.path.join(ROOT, "scripts", "pytorch_ddp_reference.py"),
                    "--spec", job, "--world", str(world), "--threads", "1", "--out", out],
                   check=True, cwd=tmp)
    with open(out) as f:
        ref = json.load(f)
    return [{"backend": ref["ranks"][str(r)]["backend"], "device": ref["ranks"][str(r)]["device"],
             "losses": [l[2] for l in ref["ranks"][str(r)]["losses"]],
             "val_losses": [e[1] for e in ref["ranks"][str(r)]["epochs"]]}
            for r in range(world)]


def apart(a, b):
    """The largest difference, relative to max(1, |b|), of two equally long series."""
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))


def check_trainer_vs_reference(a, env, tmp, rows, failures, config, job, world, precision,
                               tol, label, device):
    ours = trainer_run(a.build, job, world, env, tmp)
    theirs = reference_run(a.python, job, world, tmp)
    row = {"config": config, "job": label, "precision": precision, "device": device,
           "pytorch_device": theirs[0]["device"], "pytorch_backend": theirs[0]["backend"],
           "ranks": []}
    for r in range(world):
        step_apart = apart(ours[r]["losses"], theirs[r]["losses"])
        # Every rank validates its share; rank 0 reports the all-reduced result.
        val_apart = apart(ours[r]["val_losses"], theirs[r]["val_losses"]) if r == 0 else 0.0
        row["ranks"].append({"rank": r, "steps": len(ours[r]["losses"]),
                             "reference_steps": len(theirs[r]["losses"]),
                             "step_loss_apart": step_apart, "val_loss_apart": val_apart,
                             "trainer_start": ours[r]["start"]})
        if tol is not None and (not step_apart <= tol or not val_apart <= tol):
            failures.append(f"{label} {config} {precision} rank {r}: losses {step_apart:.3g} "
                            f"and validation {val_apart:.3g} from PyTorch's (tolerance {tol:g}; "
                            f"steps {len(ours[r]['losses'])} against {len(theirs[r]['losses'])})")
        start = ours[r]["start"]
        if not str(start.get("device")).startswith(device):
            failures.append(f"{label} {config} {precision} rank {r}: the trainer ran on "
                            f"{start.get('device')}")
    if not a.dry_run and not theirs[0]["device"].startswith("cuda"):
        failures.append(f"{label} {config}: PyTorch's side ran on {theirs[0]['device']}")
    rows.append(row)
    print(f"{label} {config} {precision}: per-step losses within "
          f"{max(x['step_loss_apart'] for x in row['ranks']):.3g} of PyTorch's, validation "
          f"within {max(x['val_loss_apart'] for x in row['ranks']):.3g} (PyTorch on "
          f"{row['pytorch_device']}, {row['pytorch_backend']}; {row['ranks'][0]['steps']} steps "
          f"a rank)", flush=True)
    return ours, theirs


def check_graph(a, env, tmp, rows, failures, label, write, tol):
    """The job with cuda_graph true against false: per-step losses, and the capture logged."""
    graphed_job, eager_job = os.path.join(tmp, f"{label}-graph.yaml"), os.path.join(
        tmp, f"{label}-eager.yaml")
    write(graphed_job, "true")
    write(eager_job, "false")
    errs = []
    graphed = trainer_run(a.build, graphed_job, 1, env, tmp, errs)
    eager = trainer_run(a.build, eager_job, 1, env, tmp)
    said = [l for e in errs for l in e.splitlines() if "train.cuda_graph" in l]
    captured = any("the step is captured" in l for l in said)
    gap = apart(graphed[0]["losses"], eager[0]["losses"])
    val_gap = apart(graphed[0]["val_losses"], eager[0]["val_losses"])
    rows.append({"graphs": label, "steps": len(graphed[0]["losses"]), "graphed_from_eager": gap,
                 "val_graphed_from_eager": val_gap, "captured": captured,
                 "log": said[-3:]})
    print(f"{label}: cuda_graph true against false: per-step losses {gap:.3g} apart, "
          f"validation {val_gap:.3g} ({len(graphed[0]['losses'])} steps); the trainer said: "
          f"{said[-1] if said else 'nothing'}", flush=True)
    if not captured:
        failures.append(f"{label}: the step was not captured in a CUDA graph ({said})")
    if not gap <= tol or not val_gap <= tol:
        failures.append(f"{label}: graphed losses {gap:.3g} (validation {val_gap:.3g}) from the "
                        f"eager run's (tolerance {tol:g})")


def check_graph_refused(a, env, tmp, rows, failures, job):
    """On the CPU: cuda_graph true is refused at once, naming it (exit 2)."""
    errs = []
    try:
        trainer_run(a.build, job, 1, env, tmp, errs)
        failures.append("cuda_graph: true on the CPU was not refused")
        return
    except RuntimeError as e:
        why = str(e)
    ok = "exit 2" in why and "train.cuda_graph" in why
    rows.append({"graphs": "refused on the CPU", "refused": ok, "message": why[-300:]})
    print(f"cuda_graph: true on the CPU: {'refused, naming it' if ok else 'NOT as expected'}",
          flush=True)
    if not ok:
        failures.append(f"cuda_graph: true on the CPU: expected exit 2 naming train.cuda_graph, "
                        f"got: {why[-300:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build dir with bin/ddp-trainer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=sys.executable, help="the Python with torch")
    ap.add_argument("--ld-library-path", default="",
                    help="LD_LIBRARY_PATH entries for ddp-trainer (a prebuilt engine's)")
    ap.add_argument("--parts", default="mlp,gpt,graphs")
    ap.add_argument("--configs", default="nccl-w1,gloo-w2")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, Gloo, world 2")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)  # The ranks run in a temporary directory.
    if os.sep in a.python:
        a.python = os.path.abspath(a.python)
    os.makedirs(a.out, exist_ok=True)
    parts = a.parts.split(",")
    device = "cpu" if a.dry_run else "cuda"
    configs = ["gloo-w2"] if a.dry_run else a.configs.split(",")
    env = {}
    if a.ld_library_path:
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (a.ld_library_path, os.environ.get("LD_LIBRARY_PATH", "")) if p)
    rows, failures = [], []
    with tempfile.TemporaryDirectory(prefix="ddp-gpu-parity-") as tmp:
        tokens = make_tokens(a.python, tmp) if ("gpt" in parts or "graphs" in parts) else None
        for config in configs if "mlp" in parts else []:
            backend, world = CONFIGS[config]
            trainer_losses = {}
            for precision in ("fp32", "bf16"):
                job = os.path.join(tmp, f"{config}-{precision}.yaml")
                write_job(job, backend, device, precision)
                ours, _ = check_trainer_vs_reference(a, env, tmp, rows, failures, config, job,
                                                     world, precision, TOLERANCE[precision],
                                                     "mlp", device)
                trainer_losses[precision] = ours
            effect = max(apart(b["losses"], f["losses"])
                         for b, f in zip(trainer_losses["bf16"], trainer_losses["fp32"]))
            rows.append({"config": config, "job": "mlp", "bf16_from_fp32": effect})
            print(f"mlp {config}: bf16's losses leave fp32's by up to {effect:.3g}", flush=True)
            if not effect > 1e-4:
                failures.append(f"mlp {config}: bf16 is within {effect:.3g} of fp32: autocast did "
                                "not take effect")
        if "gpt" in parts:
            # The GPT at NCCL world 1 on the GPU (Gloo at world 2 on the CPU).
            config = "gloo-w2" if a.dry_run else "nccl-w1"
            backend, world = CONFIGS[config]
            runs = {}
            for precision in ("fp32", "bf16"):
                job = os.path.join(tmp, f"gpt-{precision}.yaml")
                write_gpt_job(job, tokens, backend, device, precision)
                runs[precision] = check_trainer_vs_reference(
                    a, env, tmp, rows, failures, config, job, world, precision,
                    GPT_TOLERANCE if precision == "fp32" else None, "gpt", device)
            # bf16 against PyTorch's bf16, measured by how far bf16 moves either from fp32.
            ours16, theirs16 = runs["bf16"]
            ours32, theirs32 = runs["fp32"]
            ours_gap = max(apart(o["losses"], t["losses"]) for o, t in zip(ours16, theirs16))
            bf16_effect = max(apart(o["losses"], t["losses"]) for o, t in zip(theirs16, theirs32))
            ours_effect = max(apart(o["losses"], t["losses"]) for o, t in zip(ours16, ours32))
            rows.append({"config": config, "job": "gpt", "bf16_from_pytorch_bf16": ours_gap,
                         "pytorch_bf16_from_fp32": bf16_effect, "bf16_from_fp32": ours_effect})
            print(f"gpt {config} bf16: {ours_gap:.3g} from PyTorch's bf16; PyTorch's bf16 is "
                  f"{bf16_effect:.3g} from its fp32, ours {ours_effect:.3g} from ours",
                  flush=True)
            if not ours_gap <= 0.25 * bf16_effect + 1e-6:
                failures.append(f"gpt bf16: {ours_gap:.3g} from PyTorch's bf16, more than a "
                                f"quarter of bf16's own distance from fp32 ({bf16_effect:.3g})")
        if "graphs" in parts:
            if a.dry_run:
                job = os.path.join(tmp, "graph-refused.yaml")
                write_job(job, "gloo", "cpu", "fp32", graph="true")
                check_graph_refused(a, env, tmp, rows, failures, job)
            else:
                check_graph(a, env, tmp, rows, failures, "mlp",
                            lambda p, g: write_job(p, "nccl", "cuda", "fp32", graph=g), 0.0)
                check_graph(a, env, tmp, rows, failures, "gpt-bf16",
                            lambda p, g: write_gpt_job(p, tokens, "nccl", "cuda", "bf16", g),
                            GPT_TOLERANCE)
    torch_version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    with open(os.path.join(a.out, "gpu_parity.json"), "w") as f:
        json.dump({"torch": torch_version, "dry_run": a.dry_run, "rows": rows,
                   "failures": failures}, f, indent=1)
        f.write("\n")
    lines = [f"torch {torch_version}" + ("; DRY RUN on the CPU" if a.dry_run else ""), "",
             "| job | config | precision | PyTorch's device | steps a rank | per-step losses "
             "apart (largest, relative) | validation apart |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "ranks" in row:
            lines.append(f"| {row['job']} | {row['config']} | {row['precision']} | "
                         f"{row['pytorch_device']} | {row['ranks'][0]['steps']} | "
                         f"{max(x['step_loss_apart'] for x in row['ranks']):.3g} | "
                         f"{max(x['val_loss_apart'] for x in row['ranks']):.3g} |")
    lines += ["", "| graphs | steps | graphed from eager | validation | captured |",
              "|---|---|---|---|---|"]
    for row in rows:
        if "graphed_from_eager" in row:
            lines.append(f"| {row['graphs']} | {row['steps']} | {row['graphed_from_eager']:.3g} | "
                         f"{row['val_graphed_from_eager']:.3g} | {row['captured']} |")
    with open(os.path.join(a.out, "gpu_parity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
