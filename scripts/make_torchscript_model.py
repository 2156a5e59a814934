#!/usr/bin/python3
"""Writes a TorchScript model for ddp-trainer's model.torchscript (the user's own model).

    /usr/bin/python3 scripts/make_torchscript_model.py --out model.pt --inputs 30 --classes 2

The module is something no built-in model covers: a residual MLP with LayerNorm and
a fixed input-scaling buffer, scripted with torch.jit.script and saved with
torch.jit.save. ddp-trainer loads it, trains its parameters with DDP, and broadcasts
its buffers from rank 0 before every forward, as PyTorch's DDP does.
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--inputs", type=int, default=30)
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    model = torch.jit.script(ResidualMLP(args.inputs, args.classes, args.width))
    torch.jit.save(model, args.out)
    print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
