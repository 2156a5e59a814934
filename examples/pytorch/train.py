#!/usr/bin/python3
"""A torchrun-style PyTorch DDP script: an MLP on the Wisconsin breast-cancer data.

Runs unchanged under torchrun, or as a ddp command job (examples/pytorch/job.yaml):
one process per rank, started with torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, ...).

- dist.init_process_group("gloo") from the environment (env://), DDP(model), Adam,
  cross-entropy; a DistributedSampler (set_epoch every epoch) feeding a DataLoader with
  --num-workers worker processes.
- 20% of the rows held out for validation (the same split on every rank, from --seed),
  features standardized with the training split's mean and std; rank 0 validates.
- Rank 0 writes an atomic checkpoint every epoch (a temporary file, fsync, os.replace)
  to --checkpoint-dir/$TORCHELASTIC_RUN_ID/last.pt; on start every rank loads it if it
  is there and resumes with the next epoch, so a restarted attempt
  (TORCHELASTIC_RESTART_COUNT > 0) carries on where the last one checkpointed.
- Live metrics through ddp_report (a no-op outside ddp): a step line per step from every
  rank, an epoch line and a checkpoint line per epoch from rank 0.
"""

import argparse
import csv
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import ddp_report as report  # on PYTHONPATH in a ddp command job (python/ in this repository)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/breast_cancer.csv",
                   help="the CSV: a header row, then 30 features and an integer label per row")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint-dir", default="checkpoints/pytorch-example",
                   help="checkpoints go to DIR/$TORCHELASTIC_RUN_ID/last.pt (DIR/last.pt without "
                        "it): the restarts of a run resume, a new run starts afresh")
    p.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep after each step (to slow a test down)")
    return p.parse_args()


class CancerDataset(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def load_data(path, seed):
    """The training and validation datasets, standardized with the training split's stats."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]  # The first row is a header ("569,30,...").
    x = torch.tensor([[float(v) for v in r[:-1]] for r in rows], dtype=torch.float32)
    y = torch.tensor([int(float(r[-1])) for r in rows], dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = round(0.2 * len(y))
    val, train = order[:n_val], order[n_val:]
    mean, std = x[train].mean(0), x[train].std(0).clamp_min(1e-8)
    x = (x - mean) / std
    return CancerDataset(x[train], y[train]), CancerDataset(x[val], y[val])


def make_model():
    return nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                         nn.Linear(32, 2))


def save_checkpoint(path, state):
    """Writes `state` to `path` atomically: readers see the old file or the new one."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # A pipe under ddp: one line at a time.
    train_ds, val_ds = load_data(args.data, args.seed)  # Before the rendezvous: fail alike.

    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(args.seed)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    # One directory per run (a ddp job's rdzv_id, else its id; torchrun's --rdzv-id): the
    # attempts of a run share it, a new submission does not resume an old one's epochs.
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "").replace(os.sep, "_")
    ckpt_dir = os.path.join(args.checkpoint_dir, run_id) if run_id else args.checkpoint_dir
    ckpt_path = os.path.join(ckpt_dir, "last.pt")
    # Resume: every rank loads the last checkpoint before DDP() broadcasts rank 0's weights.
    start_epoch = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1
        print("rank %d/%d: resumed from epoch %d (restart count %d), continuing with epoch %d"
              % (rank, world, ckpt["epoch"], restart_count, start_epoch))
    # Every rank must start at the same epoch (the checkpoint directory must be shared).
    agreed = torch.tensor([start_epoch])
    dist.broadcast(agreed, src=0)
    if agreed.item() != start_epoch:
        raise SystemExit("rank %d: resuming at epoch %d but rank 0 at %d: is %s shared?"
                         % (rank, start_epoch, agreed.item(), ckpt_dir))

    ddp_model = DDP(model)
    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0)
    steps = len(loader)
    print("rank %d/%d (local rank %s) on %s, torch %s: %d training rows, %d validation rows, "
          "%d steps per epoch, %d of %d epochs to go, restart count %d"
          % (rank, world, os.environ.get("LOCAL_RANK", "?"), socket.gethostname(),
             torch.__version__, len(train_ds), len(val_ds), steps,
             max(0, args.epochs - start_epoch), args.epochs, restart_count))
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # A different shuffle each epoch, the same on every rank.
        ddp_model.train()
        epoch_start = last = time.perf_counter()
        loss_sum = torch.zeros(2, dtype=torch.float64)  # sum of losses * samples, samples
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(x), y)
            loss.backward()  # DDP all-reduces the gradients here.
            optimizer.step()
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
            now, loss_value = time.perf_counter(), loss.item()
            loss_sum += torch.tensor([loss_value * len(y), len(y)], dtype=torch.float64)
            report.step(loss=loss_value, epoch=epoch, step=i, steps=steps,
                        global_step=epoch * steps + i, samples_per_s=len(y) / (now - last),
                        step_ms=(now - last) * 1000, lr=optimizer.param_groups[0]["lr"])
            last = now
        dist.all_reduce(loss_sum)  # The mean training loss over every rank's samples.
        train_loss = (loss_sum[0] / loss_sum[1]).item()

        if rank == 0:
            ddp_model.module.eval()
            with torch.no_grad():
                logits = ddp_model.module(val_ds.x)  # The plain module: no DDP collectives.
                val_loss = F.cross_entropy(logits, val_ds.y).item()
                val_accuracy = (logits.argmax(1) == val_ds.y).double().mean().item()
            report.epoch(epoch=epoch, train_loss=train_loss, val_loss=val_loss,
                         val_accuracy=val_accuracy)
            save_checkpoint(ckpt_path, {"epoch": epoch, "model": ddp_model.module.state_dict(),
                                        "optimizer": optimizer.state_dict(),
                                        "val_accuracy": val_accuracy})
            report.checkpoint(path=ckpt_path, epoch=epoch, step=steps - 1,
                              global_step=epoch * steps + steps - 1)
            print("epoch %d/%d: train_loss %.4f  val_loss %.4f  val_accuracy %.4f  (%.2fs)"
                  % (epoch, args.epochs - 1, train_loss, val_loss, val_accuracy,
                     time.perf_counter() - epoch_start))

    print("rank %d/%d: done" % (rank, world))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
