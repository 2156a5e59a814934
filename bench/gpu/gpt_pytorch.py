"""PyTorch's side of the GPT bench: nanoGPT's GPT-2 in torch.nn.parallel's DDP, eager or compiled.

    torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK)
    python3 bench/gpu/gpt_pytorch.py --train train.bin [--compile] [--batch 16] [--steps 30]
        [--warmup 10] [--layers 12 --heads 12 --dim 768 --seq-len 1024 --vocab 50304]
        [--device cuda|cpu] [--backend nccl|gloo] [--precision bf16|fp32] [--profile-steps 0]

What ddp-trainer's GPT job (bench/gpu/bench.py writes it) does, in PyTorch:
  - the model is tests/reference/nanogpt.py's GPT (dropout 0, tied head), built after
    torch.manual_seed(--seed) on the CPU and then moved to the device; with --compile,
    torch.compile(model) (default mode) before DDP, as nanoGPT's train.py does;
  - DistributedDataParallel (NCCL at world 1 on a GPU; Gloo on the CPU);
  - data: a flat uint16 token file (nanoGPT's format); sample i is the window
    [i * seq_len, (i + 1) * seq_len + 1) (inputs its first seq_len ids, targets its last);
    DistributedSampler over window indices, shuffled with --seed, set_epoch each epoch,
    batches of --batch windows (a last short batch dropped: the shapes stay fixed);
  - torch.autocast(device, torch.bfloat16) around forward and loss (--precision bf16),
    fp32 parameters, gradients and optimizer state;
  - AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on nanoGPT's decay group:
    matrices and embeddings, not biases nor LayerNorm weights), fused on a GPU;
  - the learning rate: LinearLR(--warmup-start-factor -> 1 over --lr-warmup steps) then
    CosineAnnealingLR(T_max = the rest of the run, eta_min 0), joined by SequentialLR,
    stepped every step (job.yaml's `lr_schedule: {name: cosine, warmup: N}`);
  - clip_grad_norm_(1.0) before each step.
The first --warmup steps are untimed (torch.compile compiles in the first); the timed
steps run between two torch.cuda.synchronize() calls. Prints one JSON line per rank:
tokens and seconds of the timed steps, tokens/s, every step's loss (read after the run,
so no step waits for its loss), peak allocator memory, the first step's seconds (the
compile, with --compile) and the model's parameter count and FLOPs per token.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.profiler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # step_profile
from nanogpt import GPT, GPTConfig, flops_per_token  # noqa: E402
import step_profile  # noqa: E402


def load_tokens(path):
    """The whole uint16 file as an int64 tensor (numpy-free: torch 1.13 and 2.x alike)."""
    raw = bytearray(open(path, "rb").read())
    if len(raw) % 2:
        raise SystemExit(f"gpt_pytorch.py: {path}: {len(raw)} bytes is not a whole number of uint16 ids")
    return torch.frombuffer(raw, dtype=torch.int16).to(torch.int64).bitwise_and_(0xFFFF)


def batches(tokens, seq_len, batch, rank, world, seed):
    """Endless (epoch, inputs, targets) batches of windows, as ddp-trainer's data.tokens."""
    windows = (tokens.numel() - 1) // seq_len
    if windows < 1:
        raise SystemExit(f"gpt_pytorch.py: {tokens.numel()} tokens are fewer than one window of "
                         f"{seq_len + 1}")
    sampler = DistributedSampler(range(windows), num_replicas=world, rank=rank, shuffle=True,
                                 seed=seed)
    if len(sampler) < batch:
        raise SystemExit(f"gpt_pytorch.py: {windows} windows give rank {rank} {len(sampler)}, "
                         f"fewer than one batch of {batch}")
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        idx = list(sampler)
        for b in range(len(idx) // batch):
            rows = torch.stack([tokens[i * seq_len:(i + 1) * seq_len + 1]
                                for i in idx[b * batch:(b + 1) * batch]])
            yield epoch, rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        epoch += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True, help="uint16 token file (nanoGPT's format)")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model) before DDP")
    ap.add_argument("--compile-mode", default=None, help="torch.compile's mode (default: default)")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--batch", type=int, default=16, help="windows per rank per step")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--lr-warmup", type=int, default=10, help="linear lr warm-up steps")
    ap.add_argument("--warmup-start-factor", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--fused", choices=("auto", "true", "false"), default="auto",
                    help="fused AdamW (auto: on a GPU)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after the timed steps, this many more under torch.profiler "
                         "(bench/gpu/step_profile.py: the GPU's kernel time by kind)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    total = a.warmup + a.steps
    if a.lr_warmup >= total:
        raise SystemExit(f"gpt_pytorch.py: --lr-warmup {a.lr_warmup} must be below the "
                         f"{total} steps run")
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")

    config = GPTConfig(block_size=a.seq_len, vocab_size=a.vocab, n_layer=a.layers,
                       n_head=a.heads, n_embd=a.dim, dropout=0.0, bias=True, tie_weights=True)
    torch.manual_seed(a.seed)
    raw = GPT(config)
    n_params = sum(p.numel() for p in raw.parameters())
    raw.to(dev)
    fused = a.fused == "true" or (a.fused == "auto" and dev.type == "cuda")
    opt = torch.optim.AdamW(raw.param_groups(a.weight_decay, "matrices"), lr=a.lr,
                            betas=(0.9, 0.95), eps=1e-8, fused=fused)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=a.warmup_start_factor, end_factor=1.0,
                                          total_iters=a.lr_warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - a.lr_warmup, eta_min=0.0),
    ], milestones=[a.lr_warmup])
    model = raw
    if a.compile:
        kwargs = {"backend": a.compile_backend}
        if a.compile_mode:
            kwargs["mode"] = a.compile_mode
        model = torch.compile(raw, **kwargs)
    model = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)

    tokens = load_tokens(a.train)
    if int(tokens.max()) >= a.vocab:
        raise SystemExit(f"gpt_pytorch.py: {a.train}: id {int(tokens.max())} >= vocab {a.vocab}")
    data = batches(tokens, a.seq_len, a.batch, rank, world, a.seed)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    losses, lrs, step_s = [], [], []
    epochs = 0
    t_timed = None

    def train_step():
        nonlocal epochs
        epoch, x, y = next(data)
        epochs = epoch + 1
        if dev.type == "cuda":
            x = x.pin_memory().to(dev, non_blocking=True)
            y = y.pin_memory().to(dev, non_blocking=True)
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach(), lr

    for step in range(total):
        if step == a.warmup:
            sync()
            t_timed = time.perf_counter()
        t0 = time.perf_counter()
        loss, lr = train_step()
        lrs.append(lr)
        losses.append(loss)
        if step < a.warmup:
            sync()  # Untimed steps: each one's own seconds (the first: the compile).
            step_s.append(time.perf_counter() - t0)
    sync()
    train_s = time.perf_counter() - t_timed if a.steps else 0.0

    profile = None
    if a.profile_steps > 0:
        # After the timed steps, so that the profiler's own cost is in no figure above;
        # the schedule runs on past its end (the rate, not the loss, is what is read).
        try:
            with torch.profiler.profile(activities=step_profile.activities(dev.type)) as prof:
                sync()
                t0 = time.perf_counter()
                for _ in range(a.profile_steps):
                    train_step()
                sync()
                wall = time.perf_counter() - t0
            profile = step_profile.summarize(prof, wall, a.profile_steps)
        except Exception as e:  # The profile is a diagnosis: its failure is reported, not fatal.
            profile = {"error": f"{type(e).__name__}: {e}"}
    timed_tokens = a.steps * a.batch * a.seq_len
    result = {
        "rank": rank, "world": world, "backend": a.backend, "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "torch": torch.__version__,
        "compile": (a.compile_mode or "default") if a.compile else False,
        "precision": a.precision, "fused_adamw": fused,
        "batch": a.batch, "seq_len": a.seq_len, "steps": a.steps, "warmup": a.warmup,
        "tokens": timed_tokens, "train_s": round(train_s, 6),
        "tokens_per_s": round(timed_tokens / train_s, 1) if train_s > 0 else None,
        "first_step_s": round(step_s[0], 3) if step_s else None,
        "warmup_s": round(sum(step_s), 3),
        "losses": [round(float(l), 6) for l in losses],
        "lrs": [float(f"{lr:.6g}") for lr in lrs],
        "epochs": epochs,
        "params": n_params,
        "flops_per_token": flops_per_token(config, n_params),
        "peak_mem_mib": (round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
                         if dev.type == "cuda" else None),
    }
    if profile is not None:
        result["profile"] = profile
    if not all(math.isfinite(l) for l in result["losses"]):
        result["error"] = "a loss is not finite"
    print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
