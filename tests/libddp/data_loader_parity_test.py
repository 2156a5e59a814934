"""ddp::DistributedSampler in LibTorch's data loaders against PyTorch's DataLoader, live.

    PYTHON data_loader_parity_test.py DATA_LOADER_PROGRAM

PYTHON is the flavour's reference Python (Debian's torch 1.13 in build/, the venv's
2.x in build-torch2/). PyTorch's side: DataLoader(dataset, batch_size,
sampler=DistributedSampler(...), num_workers=2, drop_last) on every rank, set_epoch
before every epoch. libddp's side (data_loader_program): torch::data::make_data_loader
with a copy of a ddp::DistributedSampler, set_epoch called on the caller's copy, with 0,
2 and 3 worker threads and several max_jobs. For 2 and 3 ranks, shuffle on and off, the
sampler's drop_last and the loader's drop_last on and off, 3 epochs, dataset sizes not
divisible by the world size, every rank's batches must be PyTorch's, batch for batch.
With enforce_ordering off the batches may come in another order but must be the same
batches. A stateful dataset that draws from the sampler itself gives PyTorch's batches
in order with 0 or 1 worker, the same batches in some order with more. Last, a real
2-rank DDP training run fed by the loader with worker threads must give the losses of
the same run fed by index arithmetic on sampler.indices(), bit for bit.
"""
import json
import subprocess
import sys
import unittest

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from local_ranks import run_ranks  # this directory

PROGRAM = None
EPOCHS = 3


class Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def pytorch_batches(n, world, shuffle, seed, sampler_drop_last, batch, loader_drop_last):
    """[[[indices of each batch] per epoch] per rank], from PyTorch's DataLoader."""
    ds = Indices(n)
    ranks = []
    for rank in range(world):
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=shuffle,
                                     seed=seed, drop_last=sampler_drop_last)
        loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=2,
                            drop_last=loader_drop_last, persistent_workers=True)
        epochs = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            epochs.append([b.tolist() for b in loader])
        ranks.append(epochs)
        del loader
    return ranks


def run(mode, cases):
    """One program run for all `cases` (lists of arguments); a JSON result per case."""
    args = [mode] + [str(a) for case in cases for a in case]
    out = subprocess.run([PROGRAM] + args, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise AssertionError(f"{args}: exit {out.returncode}: {out.stderr}")
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == len(cases), out.stdout
    return results


def flag(b):
    return "1" if b else "0"


# (n, world, shuffle, seed, sampler drop_last, batch, loader drop_last): sizes not
# divisible by the world size (the sampler pads or cuts), batches that do not divide a
# rank's share (a last partial batch, kept or dropped).
CASES = [(n, world, shuffle, seed, sdl, batch, ldl)
         for (n, world, batch, seed) in ((101, 2, 8, 0), (100, 3, 7, 5))
         for shuffle in (True, False)
         for sdl in (False, True)
         for ldl in (False, True)]


class DataLoaderParityTest(unittest.TestCase):
    def test_stateless_loader_matches_pytorch(self):
        checked = 0
        loaders = ((0, 0), (2, 0), (3, 1), (2, 5))  # (workers, max_jobs (0: the default))
        runs = [(case, workers, max_jobs) for case in CASES for workers, max_jobs in loaders]
        results = run("batches", [
            [n, world, flag(shuffle), seed, flag(sdl), batch, flag(ldl), workers, max_jobs,
             EPOCHS, "1"]
            for (n, world, shuffle, seed, sdl, batch, ldl), workers, max_jobs in runs])
        wants = {case: pytorch_batches(*case) for case in CASES}
        for (case, workers, max_jobs), got in zip(runs, results):
            n, world, shuffle, seed, sdl, batch, ldl = case
            want = wants[case]
            where = f"{case} workers {workers} max_jobs {max_jobs} (PyTorch {torch.__version__})"
            self.assertEqual(got["ranks"], want, where)
            # The caller's sampler (whose set_epoch reached the loader's copy) lists
            # the same indices as the loader yielded.
            for rank in range(world):
                for epoch in range(EPOCHS):
                    flat = [i for b in want[rank][epoch] for i in b]
                    self.assertEqual(got["indices"][rank][epoch][:len(flat)], flat, where)
            checked += 1
            # Epochs differ when shuffled (set_epoch reached the loader's copy).
            if shuffle:
                self.assertNotEqual(want[0][0], want[0][1], case)
        self.assertEqual(checked, len(CASES) * len(loaders))
        print(f"stateless: {checked} runs, each rank's batches equal to PyTorch "
              f"{torch.__version__}'s DataLoader(num_workers=2)")

    def test_unordered_gives_the_same_batches(self):
        cases = CASES[:4] + CASES[8:12]
        results = run("batches", [
            [n, world, flag(shuffle), seed, flag(sdl), batch, flag(ldl), 3, 6, EPOCHS, "0"]
            for n, world, shuffle, seed, sdl, batch, ldl in cases])
        for case, got in zip(cases, results):
            want = pytorch_batches(*case)
            world = case[1]
            for rank in range(world):
                for epoch in range(EPOCHS):
                    self.assertEqual(sorted(got["ranks"][rank][epoch]),
                                     sorted(want[rank][epoch]), f"{case} rank {rank}")

    def test_stateful_dataset(self):
        # The stateful loader's drop_last is not compared: PyTorch's loader drop_last off.
        runs = [(case, workers) for case in CASES if not case[6] for workers in (0, 1, 2)]
        results = run("stateful", [
            [n, world, flag(shuffle), seed, flag(sdl), batch, workers, EPOCHS]
            for (n, world, shuffle, seed, sdl, batch, ldl), workers in runs])
        for (case, workers), result in zip(runs, results):
            world = case[1]
            want = pytorch_batches(*case)
            got = result["ranks"]
            where = f"stateful {case} workers {workers}"
            if workers <= 1:
                self.assertEqual(got, want, where)
            else:
                for rank in range(world):
                    for epoch in range(EPOCHS):
                        self.assertEqual(sorted(got[rank][epoch]), sorted(want[rank][epoch]),
                                         where)

    def test_training_with_loader_workers_matches_index_arithmetic(self):
        def train(args):
            outs = []
            for code, out, err in run_ranks([PROGRAM, "train"] + args, 2, prefix="loader-train-",
                                            timeout=120):
                self.assertEqual(code, 0, f"train {args}: {err}")
                outs.append(json.loads(out)["losses"])
            return outs

        want = train(["index"])
        # ceil(ceil(999 / 2) / 32) = 16 steps an epoch, 3 epochs.
        self.assertEqual([len(l) for l in want], [48, 48])
        self.assertLess(want[0][-1], want[0][0])  # It trains.
        for workers in ("0", "2"):
            got = train(["loader", workers])
            self.assertEqual(got, want, f"loader with {workers} workers")
        print(f"training: 2 ranks x 48 steps, the loader's losses (0 and 2 workers) equal "
              f"index arithmetic's; first {want[0][0]:.6f}, last {want[0][-1]:.6f}")


if __name__ == "__main__":
    PROGRAM = sys.argv.pop(1)
    unittest.main(verbosity=2)
