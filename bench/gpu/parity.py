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

--dry-run does the same on the CPU (Gloo, world 2 only): what CI runs where no GPU is.
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


def write_job(path, backend, device, precision):
    with open(os.path.join(ROOT, "tests", "fixtures", "synthetic_bf16.yaml")) as f:
        spec = yaml.safe_load(f)
    spec["name"] = f"gpu-parity-{backend}-{precision}"
    spec["backend"] = backend
    spec["train"].update(precision=precision, device=device, intra_node_comm="gloo")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f, sort_keys=False)


def trainer_run(build, job, world, env, tmp):
    outs = run_ranks(lambda r: [os.path.join(build, "bin", "ddp-trainer"), "--spec", job],
                     world, env, tmp, timeout=300)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build dir with bin/ddp-trainer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=sys.executable, help="the Python with torch")
    ap.add_argument("--ld-library-path", default="",
                    help="LD_LIBRARY_PATH entries for ddp-trainer (a prebuilt engine's)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, Gloo, world 2")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)  # The ranks run in a temporary directory.
    if os.sep in a.python:
        a.python = os.path.abspath(a.python)
    os.makedirs(a.out, exist_ok=True)
    device = "cpu" if a.dry_run else "cuda"
    configs = ["gloo-w2"] if a.dry_run else list(CONFIGS)
    env = {}
    if a.ld_library_path:
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (a.ld_library_path, os.environ.get("LD_LIBRARY_PATH", "")) if p)
    rows, failures = [], []
    with tempfile.TemporaryDirectory(prefix="ddp-gpu-parity-") as tmp:
        for config in configs:
            backend, world = CONFIGS[config]
            trainer_losses = {}
            for precision in ("fp32", "bf16"):
                job = os.path.join(tmp, f"{config}-{precision}.yaml")
                write_job(job, backend, device, precision)
                ours = trainer_run(a.build, job, world, env, tmp)
                theirs = reference_run(a.python, job, world, tmp)
                trainer_losses[precision] = ours
                row = {"config": config, "precision": precision, "device": device,
                       "pytorch_device": theirs[0]["device"],
                       "pytorch_backend": theirs[0]["backend"], "ranks": []}
                for r in range(world):
                    step_apart = apart(ours[r]["losses"], theirs[r]["losses"])
                    # Every rank validates its share; rank 0 reports the all-reduced result.
                    val_apart = (apart(ours[r]["val_losses"], theirs[r]["val_losses"])
                                 if r == 0 else 0.0)
                    row["ranks"].append({"rank": r, "steps": len(ours[r]["losses"]),
                                         "reference_steps": len(theirs[r]["losses"]),
                                         "step_loss_apart": step_apart,
                                         "val_loss_apart": val_apart,
                                         "trainer_start": ours[r]["start"]})
                    tol = TOLERANCE[precision]
                    if not step_apart <= tol or not val_apart <= tol:
                        failures.append(f"{config} {precision} rank {r}: losses {step_apart:.3g} "
                                        f"and validation {val_apart:.3g} from PyTorch's "
                                        f"(tolerance {tol:g}; steps {len(ours[r]['losses'])} "
                                        f"against {len(theirs[r]['losses'])})")
                    start = ours[r]["start"]
                    if (start.get("precision") != precision or start.get("backend") != backend
                            or not str(start.get("device")).startswith(device)):
                        failures.append(f"{config} {precision} rank {r}: the trainer's start "
                                        f"event says precision {start.get('precision')}, "
                                        f"backend {start.get('backend')}, device "
                                        f"{start.get('device')}")
                if not a.dry_run and not theirs[0]["device"].startswith("cuda"):
                    failures.append(f"{config}: PyTorch's side ran on {theirs[0]['device']}")
                rows.append(row)
                print(f"{config} {precision}: per-step losses within "
                      f"{max(x['step_loss_apart'] for x in row['ranks']):.3g} of PyTorch's, "
                      f"validation within {max(x['val_loss_apart'] for x in row['ranks']):.3g} "
                      f"(PyTorch on {row['pytorch_device']}, {row['pytorch_backend']}; "
                      f"{row['ranks'][0]['steps']} steps a rank)", flush=True)
            effect = max(apart(b["losses"], f["losses"])
                         for b, f in zip(trainer_losses["bf16"], trainer_losses["fp32"]))
            rows.append({"config": config, "bf16_from_fp32": effect})
            print(f"{config}: bf16's losses leave fp32's by up to {effect:.3g}", flush=True)
            if not effect > 1e-4:
                failures.append(f"{config}: bf16 is within {effect:.3g} of fp32: autocast did "
                                "not take effect")
    torch_version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    with open(os.path.join(a.out, "gpu_parity.json"), "w") as f:
        json.dump({"torch": torch_version, "dry_run": a.dry_run, "rows": rows,
                   "failures": failures}, f, indent=1)
        f.write("\n")
    lines = [f"torch {torch_version}" + ("; DRY RUN on the CPU" if a.dry_run else ""), "",
             "| config | precision | PyTorch's device | steps a rank | per-step losses apart "
             "(largest, relative) | validation apart |", "|---|---|---|---|---|---|"]
    for row in rows:
        if "ranks" in row:
            lines.append(f"| {row['config']} | {row['precision']} | {row['pytorch_device']} | "
                         f"{row['ranks'][0]['steps']} | "
                         f"{max(x['step_loss_apart'] for x in row['ranks']):.3g} | "
                         f"{max(x['val_loss_apart'] for x in row['ranks']):.3g} |")
    with open(os.path.join(a.out, "gpu_parity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
