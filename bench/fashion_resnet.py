#!/usr/bin/python3
"""examples/cpp/train.cc's model and loop in PyTorch's Python DDP: the bench's other side.

One rank of it (torchrun's environment); the same residual CNN, data, sampler, batch,
optimizer, schedule and thread count as fashion_resnet, the libddp example. Rank 0 prints
"epoch E: ..., S s" with the seconds of the epoch's training loop, as the example does.
"""
import argparse
import gzip
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DistributedSampler


class ResidualBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
                         if stride != 1 or cin != cout else None)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.stage1 = ResidualBlock(16, 16, 1)
        self.stage2 = ResidualBlock(16, 32, 2)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        h = self.stage2(self.stage1(F.max_pool2d(h, 2)))
        return self.head(h.mean((2, 3)))


def load(data, split, limit):
    with gzip.open(f"{data}/{split}-images-idx3-ubyte.gz") as f:
        images = f.read()
    with gzip.open(f"{data}/{split}-labels-idx1-ubyte.gz") as f:
        labels = f.read()
    n = len(labels) - 8
    if limit > 0:
        n = min(n, limit)
    x = torch.frombuffer(bytearray(images[16:16 + n * 784]), dtype=torch.uint8)
    x = x.reshape(n, 1, 28, 28).float().div_(255.0).sub_(0.2860).div_(0.3530)
    y = torch.frombuffer(bytearray(labels[8:8 + n]), dtype=torch.uint8).long()
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x_train, y_train = load(a.data, "train", a.limit)
    model = nn.parallel.DistributedDataParallel(ResNet())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sampler = DistributedSampler(range(len(x_train)), shuffle=True, seed=0)
    steps = math.ceil(len(sampler) / a.batch_size)
    warmup = min(steps, 50)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, a.epochs * steps - warmup)),
    ], milestones=[warmup])
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        model.train()
        start = time.perf_counter()
        for step in range(steps):
            idx = order[step * a.batch_size:(step + 1) * a.batch_size]
            loss = F.cross_entropy(model(x_train.index_select(0, idx)), y_train.index_select(0, idx))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            loss.item()
        seconds = time.perf_counter() - start
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: train_loss {loss.item():.4f}, {seconds:.3f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
