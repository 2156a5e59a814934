"""The full-stack GPU check's command job (bench/gpu/stack.py): plain PyTorch DDP under ddp.

    command: [python3, torch_job.py, --steps, "200"]

A torchrun-style script, as docs/command-jobs.md describes: init_process_group from the
environment ddp-worker gives every rank (NCCL on a GPU, Gloo on the CPU), a small MLP in
torch.nn.parallel.DistributedDataParallel on cuda:LOCAL_RANK (the worker sets
CUDA_VISIBLE_DEVICES to the rank's own GPU, so that is cuda:0), synthetic data, and a
`step` line to DDP_EVENTS_FD every --every steps. It prints the device it trained on
("device: NVIDIA H100 80GB HBM3") and exits 0.

--drop-ld-path DIR: the control plane's libraries (the Debian 12 ones stack.py carries)
reach every rank through the worker's LD_LIBRARY_PATH; Python and torch want the
machine's own, so the script first re-executes itself without DIR in it.
"""
import argparse
import json
import os
import sys
import time


def drop_ld_path(dirs):
    parts = os.environ.get("LD_LIBRARY_PATH", "").split(":")
    kept = [p for p in parts if p and os.path.normpath(p) not in dirs]
    if kept == [p for p in parts if p]:
        return
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(kept))
    if not kept:
        del env["LD_LIBRARY_PATH"]
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)  # fds (DDP_EVENTS_FD) stay


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--every", type=int, default=10, help="a step line every N steps")
    ap.add_argument("--drop-ld-path", action="append", default=[])
    a = ap.parse_args()
    drop_ld_path({os.path.normpath(d) for d in a.drop_ld_path})

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    events = None
    if os.environ.get("DDP_EVENTS_FD"):
        events = os.fdopen(int(os.environ["DDP_EVENTS_FD"]), "w", buffering=1)

    def report(**line):
        if events:
            events.write(json.dumps(line) + "\n")

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        name = "cpu"
    print(f"device: {name}", flush=True)
    print(f"rank {rank}/{world} on {device} ({dist.get_backend()}), torch {torch.__version__}",
          flush=True)

    torch.manual_seed(0)
    features, classes = 64, 10
    x_all = torch.randn(8192, features)
    y_all = (x_all @ torch.randn(features, classes)).argmax(1)
    x_all, y_all = x_all.to(device), y_all.to(device)
    model = torch.nn.Sequential(torch.nn.Linear(features, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, classes)).to(device)
    ddp = DDP(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)
    start = last = time.perf_counter()
    first_loss = loss = None
    for step in range(a.steps):
        idx = torch.randint(0, x_all.shape[0], (a.batch,), generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        out = loss_fn(ddp(x_all[idx]), y_all[idx])
        out.backward()
        opt.step()
        if (step + 1) % a.every == 0 or step + 1 == a.steps:
            loss = out.item()  # synchronizes
            first_loss = loss if first_loss is None else first_loss
            now = time.perf_counter()
            steps_done = a.every if (step + 1) % a.every == 0 else (step + 1) % a.every
            report(type="step", loss=loss, epoch=0, step=step, steps=a.steps, global_step=step,
                   samples_per_s=steps_done * a.batch / max(now - last, 1e-9),
                   step_ms=1000.0 * (now - last) / steps_done)
            last = now
    train_s = time.perf_counter() - start
    report(type="done", epochs=1, global_step=a.steps, samples=a.steps * a.batch,
           train_s=train_s)
    summary = {"rank": rank, "device": name, "steps": a.steps, "first_loss": first_loss,
               "last_loss": loss, "train_s": round(train_s, 3),
               "ld_library_path": os.environ.get("LD_LIBRARY_PATH")}
    if cuda:
        summary["max_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
