"""PyTorch's side of the GPU bench: bench/gpu/models.py's model in torch.nn.parallel's DDP.

    torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK)
    python3 bench/gpu/pytorch_ddp.py --model NAME --batch B --steps N --warmup W
                                     --backend nccl|gloo --device cuda|cpu [--samples S]
                                     [--compile reduce-overhead] [--compile-backend B]

The same loop as ddp-bench-gpu: SGD (lr 0.01, momentum 0.9), synthetic samples held on
the CPU and each batch copied to the device, loss.item() every --loss-every steps (as
ddp-trainer reports its loss every metrics.every_steps; 1: every step) and after the last;
prints one JSON line with the samples and seconds of the steps after the first W (the
GPU synchronized at both ends).

--compile MODE: torch.compile(model, mode=MODE) before DDP (nanoGPT's order; MODE
"default" for torch.compile's default). "reduce-overhead" runs the compiled forward and
backward as CUDA graphs (cudagraph trees), recorded in the first steps after the compile:
the W warm-up steps (bench.py gives 20) hold the compile and the recording, and the JSON
line gives the first step's seconds (the compile). --compile-backend other than inductor
(aot_eager: the dry run on a CPU, where inductor's C++ compile takes minutes) drops MODE.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import CLASSES, FEATURES, make  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(FEATURES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--compile", default="none",
                    help="none, or torch.compile's mode: default, reduce-overhead, ...")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--loss-every", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    samples = a.samples or (a.warmup + a.steps) * a.batch * world
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, FEATURES[a.model], generator=g)
    y = torch.randint(0, CLASSES, (samples,), generator=g)
    module = make(a.model).to(dev)
    compiled = None
    if a.compile != "none":
        kwargs = {"backend": a.compile_backend}
        if a.compile_backend == "inductor" and a.compile != "default":
            kwargs["mode"] = a.compile
        module = torch.compile(module, **kwargs)
        compiled = kwargs.get("mode", "default") + f" ({a.compile_backend})"
    model = DDP(module, device_ids=[dev] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first_step_s, start = None, None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:  # The clock starts with the GPU idle.
            if dev.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        t0 = time.perf_counter()
        begin = ((step * world + rank) * a.batch) % (samples - a.batch + 1)
        xb = x[begin:begin + a.batch].to(dev)
        yb = y[begin:begin + a.batch].to(dev)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % a.loss_every == 0 or step + 1 == a.warmup + a.steps:
            loss.item()
        if step == 0:
            first_step_s = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - start if start is not None else 0.0
    timed = a.steps * a.batch
    print(json.dumps({"rank": rank, "samples": timed, "train_s": train_s, "backend": a.backend,
                      "device": str(dev), "compile": compiled,
                      "first_step_s": round(first_step_s, 3) if first_step_s else None}),
          flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
