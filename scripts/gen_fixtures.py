#!/usr/bin/python3
"""Regenerates tests/fixtures from Debian's python3-torch (the reference PyTorch), and
tests/fixtures/torch2 from PyPI's torch 2.x (the second reference, docs/torch.md):

    /usr/bin/python3 scripts/gen_fixtures.py            # PyTorch 1.13: everything below
    .venv-torch2/bin/python scripts/gen_fixtures.py     # PyTorch 2.x: torch2/, the DDP losses
                                                        # and libddp_parity.json only

- sampler_grid.txt: torch.utils.data.DistributedSampler's indices over a grid of
  (n, world, rank, seed, epoch, shuffle, drop_last), one case per line:
      n world rank seed epoch shuffle drop_last : i0 i1 ...
- lr_schedules.json: torch.optim.lr_scheduler's learning rates, step by step, for a
  set of train.lr_schedule configurations.
- norm_frozen_model.pt: the TorchScript model of torchscript_norm_accum.yaml
  (scripts/make_torchscript_model.py --variant norm-frozen).
- <job>.losses.json: PyTorch DDP's per-rank, per-step losses and per-epoch
  validation results for each tests/fixtures/<job>.yaml, from
  scripts/pytorch_ddp_reference.py (2 ranks, gloo).
- libddp_parity.json: tests/libddp/parity_reference.py's (2 and 3 ranks).
"""

import itertools
import os
import subprocess
import sys

import torch
from torch.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def sampler_grid():
    lines = [f"# torch {torch.__version__}: n world rank seed epoch shuffle drop_last : indices"]
    for n, world, seed, epoch, shuffle, drop_last in itertools.product(
            [1, 2, 5, 10, 17, 100, 455], [1, 2, 3, 4, 7], [0, 7], [0, 3], [1, 0], [0, 1]):
        for rank in range(world):
            s = DistributedSampler(Sized(n), num_replicas=world, rank=rank, shuffle=bool(shuffle),
                                   seed=seed, drop_last=bool(drop_last))
            s.set_epoch(epoch)
            idx = list(iter(s))
            assert len(idx) == len(s)
            lines.append(f"{n} {world} {rank} {seed} {epoch} {shuffle} {drop_last} : "
                         + " ".join(map(str, idx)))
    with open(os.path.join(FIXTURES, "sampler_grid.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"sampler_grid.txt: {len(lines) - 1} cases")


def torchscript_models():
    out = os.path.join(FIXTURES, "norm_frozen_model.pt")
    subprocess.run([sys.executable, os.path.join(HERE, "make_torchscript_model.py"), "--out", out,
                    "--inputs", "30", "--classes", "2", "--width", "16", "--seed", "2",
                    "--variant", "norm-frozen"], check=True)


def lr_schedules():
    """lr_schedules.json: torch.optim.lr_scheduler's learning rates, step by step, for
    train.lr_schedule configurations (the reference script's make_scheduler)."""
    import json
    sys.path.insert(0, HERE)
    from pytorch_ddp_reference import make_scheduler
    cases = [
        {"name": "step", "step_size": 3, "gamma": 0.5},
        {"name": "step", "warmup": 4, "warmup_start_factor": 0.25, "step_size": 2, "gamma": 0.1},
        {"name": "cosine", "t_max": 12, "eta_min": 0.001},
        {"name": "cosine", "warmup": 5, "warmup_start_factor": 0.1, "eta_min": 0.0},
        {"name": "linear", "t_max": 8, "end_factor": 0.0},
        {"name": "linear", "warmup": 3, "warmup_start_factor": 0.5, "end_factor": 0.2},
        {"name": "constant", "warmup": 4, "warmup_start_factor": 0.1},
    ]
    total, base = 20, 0.3
    out = []
    for case in cases:
        p = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([p], lr=base)
        scheduler = make_scheduler(case, optimizer, total)
        lrs = []
        for _ in range(total + 5):  # Past the end too: cosine's period, linear's floor.
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        out.append({"schedule": case, "base_lr": base, "total": total, "lrs": lrs})
    with open(os.path.join(FIXTURES, "lr_schedules.json"), "w") as f:
        json.dump({"torch": torch.__version__, "cases": out}, f, indent=1)
    print(f"lr_schedules.json: {len(out)} schedules")


def ddp_losses(out_dir):
    for job in ["cancer_adam", "synthetic_sgd_accum", "fmnist_cnn", "torchscript_norm_accum",
                "synthetic_clip_cosine", "cancer_step_epoch"]:  # bf16's runs live (its
        # CPU kernels round differently from machine to machine: TrainerBf16Test)
        spec = os.path.join(FIXTURES, job + ".yaml")
        out = os.path.join(out_dir, job + ".losses.json")
        subprocess.run([sys.executable, os.path.join(HERE, "pytorch_ddp_reference.py"),
                        "--spec", spec, "--world", "2", "--threads", "1", "--out", out],
                       check=True)
        print(f"{job}.losses.json written")


def libddp_parity(out_dir):
    out = os.path.join(out_dir, "libddp_parity.json")
    with open(out + ".tmp", "w") as f:
        subprocess.run([sys.executable, os.path.join(HERE, "..", "tests", "libddp",
                                                     "parity_reference.py")],
                       stdout=f, check=True)
    os.replace(out + ".tmp", out)
    print(f"{os.path.relpath(out, FIXTURES)} written")


if __name__ == "__main__":
    if torch.__version__.startswith("1."):
        sampler_grid()
        torchscript_models()
        lr_schedules()
        ddp_losses(FIXTURES)
        libddp_parity(FIXTURES)
    else:
        torch2 = os.path.join(FIXTURES, "torch2")
        os.makedirs(torch2, exist_ok=True)
        ddp_losses(torch2)
        libddp_parity(torch2)
