"""A PyTorch DDP-style program whose rank STALL_RANK blocks forever in a function of its
own before step STALL_STEP's all-reduce, run as a command job by diagnosis_test
(decision 194). block_forever() opens FIFO and reads it: the open returns when the test
holds the other end, and the read blocks until the test closes it (a call that never
returns: a lock, a hung mount). The other ranks go on into the step's
torch.distributed.all_reduce and wait there. Every rank reports every step through
ddp_report, so the coordinator's stall watch follows each of them.

    python3 stall_program.py STEPS STALL_RANK STALL_STEP FIFO
"""
import sys

import ddp_report as report
import torch
import torch.distributed as dist


def block_forever(fifo):
    with open(fifo, "rb") as f:
        f.read(1)


def main():
    steps, stall_rank, stall_step, fifo = int(sys.argv[1]), int(sys.argv[2]), \
        int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    weight = torch.zeros(8)
    for step in range(steps):
        if rank == stall_rank and step == stall_step:
            print("STALL rank %d blocks at step %d" % (rank, step), flush=True)
            block_forever(fifo)
        grad = torch.full((8,), float(rank + step))
        dist.all_reduce(grad)
        weight -= 0.01 * grad / dist.get_world_size()
        report.step(loss=float(weight.abs().sum()), step=step, steps=steps, global_step=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
