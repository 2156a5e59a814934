#!/usr/bin/python3
"""Writes a TorchScript model for ddp-trainer's model.torchscript (the user's own model).

    /usr/bin/python3 scripts/make_torchscript_model.py --out model.pt --inputs 30 --classes 2 \
        [--variant residual|norm-frozen]

The module is something no built-in model covers, scripted with torch.jit.script and
saved with torch.jit.save:
- residual (default): a residual MLP with LayerNorm and a fixed input-scaling buffer;
- norm-frozen: buffers that training forwards change (BatchNorm1d, and a running-mean
  centring whose buffer shifts the outputs) plus a frozen first layer
  (requires_grad=False), to hold ddp-trainer to DDP's buffer broadcasts and to its
  handling of parameters that do not require grad.
ddp-trainer loads it, trains the parameters that require grad with DDP, and
broadcasts its buffers from rank 0 when PyTorch's DDP does.
"""

import argparse

import torch
from torch import nn


class ResidualMLP(nn.Module):
    def __init__(self, inputs: int, classes: int, width: int):
        super().__init__()
        self.register_buffer("input_scale", torch.ones(inputs))
        self.inp = nn.Linear(inputs, width)
        self.norm = nn.LayerNorm(width)
        self.block = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x.flatten(1) * self.input_scale))
        h = h + self.block(self.norm(h))
        return self.head(h)


class RunningCenter(nn.Module):
    """Subtracts a running mean of its input that training forwards update: unlike
    BatchNorm's running statistics, this buffer changes training outputs."""

    def __init__(self, features: int, momentum: float = 0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("mean", torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.mean.mul_(1 - self.momentum).add_(x.mean(0).detach() * self.momentum)
        return x - self.mean


class NormFrozenMLP(nn.Module):
    def __init__(self, inputs: int, classes: int, width: int):
        super().__init__()
        self.stem = nn.Linear(inputs, width)
        self.stem.requires_grad_(False)  # A frozen (e.g. pretrained) layer.
        self.bn = nn.BatchNorm1d(width)
        # After the BatchNorm, which would cancel a shift before it.
        self.center = RunningCenter(width)
        self.head = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.stem(x.flatten(1))))
        return self.head(self.center(h))


VARIANTS = {"residual": ResidualMLP, "norm-frozen": NormFrozenMLP}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--inputs", type=int, default=30)
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", choices=sorted(VARIANTS), default="residual")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    model = torch.jit.script(VARIANTS[args.variant](args.inputs, args.classes, args.width))
    torch.jit.save(model, args.out)
    print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
