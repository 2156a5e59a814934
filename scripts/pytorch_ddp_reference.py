#!/usr/bin/python3
"""PyTorch's own DDP on a ddp job.yaml: the reference ddp-trainer is held to.

Runs torch.nn.parallel.DistributedDataParallel (gloo) with the same data split,
model, initial weights, DistributedSampler, DataLoader, optimizer, loss and
validation that ddp-trainer builds from the same job file (docs/trainer.md), and
writes every rank's per-step losses, per-epoch validation results and throughput
(validation excluded from train_s) as JSON. Used to generate the test fixtures
(scripts/gen_fixtures.py) and by the benchmark (bench/). model.gpt is nanoGPT's GPT
(tests/reference/nanogpt.py) over data.tokens' windows (TokenWindows below).

Run it with Debian's interpreter (python3-torch 1.13 lives there):

    /usr/bin/python3 scripts/pytorch_ddp_reference.py --spec job.yaml --world 2 \
        --out losses.json [--threads 1] [--max-steps N]

It launches its own ranks with torchrun's variables (Debian's torchrun is broken on
Python 3.11). Relative paths in the spec resolve against the spec's directory.
"""

import argparse
import gzip
import json
import math
import os
import socket
import struct
import sys
import time


def free_port():
    # In the repository, a port claimed against tests run beside this one (ctest -j;
    # tests/common/ddp_test_ports.py); elsewhere, one the kernel says is free.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "common"))
    try:
        from ddp_test_ports import claim_port
    except ImportError:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    return claim_port()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per rank (0: cores / world, as ddp-trainer)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many optimizer steps (overrides train.max_steps)")
    p.add_argument("--index-loader", action="store_true",
                   help="gather each batch with one index_select instead of DataLoader's "
                        "per-sample collate (the data path ddp-trainer uses; and no "
                        "DataLoader iterator, whose base seed is a draw from the global "
                        "generator every epoch)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


# ---------------------------------------------------------------- the job, as ddp reads it

def load_spec(path):
    import yaml
    with open(path) as f:
        spec = yaml.safe_load(f)
    train = spec.setdefault("train", {})
    train.setdefault("epochs", 1)
    train.setdefault("drop_last", False)
    train.setdefault("shuffle", True)
    train.setdefault("loss", "cross_entropy")
    train.setdefault("bucket_cap_mb", 25)
    train.setdefault("grad_accum_steps", 1)
    train.setdefault("seed", 0)
    train.setdefault("max_steps", 0)
    opt = train.setdefault("optimizer", {"name": "adam"})
    spec.setdefault("data", {}).setdefault("seed", 0)
    return spec, opt


def read_idx(images, labels):
    import torch
    with gzip.open(images, "rb") if images.endswith(".gz") else open(images, "rb") as f:
        raw = f.read()
    magic, n, rows, cols = struct.unpack(">IIII", raw[:16])
    assert magic == 0x803, images
    x = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8).reshape(n, 1, rows, cols)
    with gzip.open(labels, "rb") if labels.endswith(".gz") else open(labels, "rb") as f:
        raw = f.read()
    y = torch.frombuffer(bytearray(raw[8:]), dtype=torch.uint8)
    return x.float().div_(255.0), y.double()


def load_data(spec, loss):
    """The split and standardization of docs/trainer.md (Data split), as trainer/dataset.cc does."""
    import torch
    d = spec["data"]
    val = None
    if "csv" in d:
        c = d["csv"]
        rows = []
        with open(c["path"]) as f:
            for i, line in enumerate(f):
                if i < c.get("skip_rows", 0) or not line.strip():
                    continue
                rows.append([float(v) for v in line.strip().split(",")])
        t = torch.tensor(rows, dtype=torch.float64)
        lc = c.get("label_column", -1) % t.shape[1]
        keep = [i for i in range(t.shape[1]) if i != lc]
        x, y = t[:, keep].float(), t[:, lc]
    elif "idx" in d:
        x, y = read_idx(d["idx"]["images"], d["idx"]["labels"])
    else:
        s = d.get("synthetic") or {}
        n, f, k = s.get("samples", 4096), s.get("features", 64), s.get("classes", 10)
        torch.manual_seed(d["seed"])
        x = torch.randn(n, f)
        if loss == "cross_entropy":
            y = x.matmul(torch.randn(f, k)).argmax(1).double()
        else:
            score = x.matmul(torch.randn(f, 1) / math.sqrt(f)).squeeze(1)
            y = (score.gt(0) if loss == "bce_with_logits" else score).double()
    v = d.get("validation") or {}
    if "idx" in v:
        val = read_idx(v["idx"]["images"], v["idx"]["labels"])
    elif v.get("fraction", 0) > 0:
        n = x.shape[0]
        n_val = round(v["fraction"] * n)  # Python rounds half to even, as ddp does.
        torch.manual_seed(d["seed"])
        perm = torch.randperm(n)
        val = (x[perm[n - n_val:]], y[perm[n - n_val:]])
        x, y = x[perm[:n - n_val]], y[perm[:n - n_val]]
    if "csv" in d and d["csv"].get("standardize"):
        mean = x.mean(0, keepdim=True)
        std = x.std(0, unbiased=False, keepdim=True)
        std = torch.where(std.eq(0), torch.ones_like(std), std)
        x = (x - mean) / std
        if val is not None:
            val = ((val[0] - mean) / std, val[1])
    num_classes = 0
    if loss == "cross_entropy":
        num_classes = max(2, int(y.max()) + 1, int(val[1].max()) + 1 if val else 0)
        y = y.long()
        val = (val[0], val[1].long()) if val else None
    else:
        y = y.float()
        val = (val[0], val[1].float()) if val else None
    return x, y, val, num_classes


class TokenWindows:
    """data.tokens as a Dataset (docs/trainer.md, GPT): a flat little-endian file of
    uint16 or uint32 token ids; sample i is the window [i * T, (i + 1) * T + 1), its
    input the first T tokens and its target the last T."""

    def __init__(self, path, dtype, seq_len):
        import torch
        with open(path, "rb") as f:
            raw = bytearray(f.read())
        wide = dtype == "uint32"
        ids = torch.frombuffer(raw, dtype=torch.int32 if wide else torch.int16).long()
        self.tokens = ids & (0xFFFFFFFF if wide else 0xFFFF)
        self.seq_len = seq_len

    def __len__(self):
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i):
        w = self.tokens[i * self.seq_len:(i + 1) * self.seq_len + 1]
        return w[:-1], w[1:]


def import_nanogpt():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "reference"))
    import nanogpt
    return nanogpt


def gpt_config(spec):
    """model.gpt's fields (job.yaml defaults: GPT-2 124M) as nanoGPT's GPTConfig."""
    nanogpt = import_nanogpt()
    g = spec["model"]["gpt"] or {}
    return nanogpt.GPTConfig(block_size=g.get("seq_len", 1024), vocab_size=g.get("vocab", 50304),
                             n_layer=g.get("layers", 12), n_head=g.get("heads", 12),
                             n_embd=g.get("dim", 768), dropout=g.get("dropout", 0.0),
                             tie_weights=g.get("tie_weights", True))


def load_tokens(spec):
    """data.tokens and data.validation.tokens as TokenWindows of model.gpt.seq_len."""
    d, seq_len = spec["data"], gpt_config(spec).block_size
    t = d["tokens"]
    dtype = t.get("dtype", "uint16")
    train = TokenWindows(t["path"], dtype, seq_len)
    v = (d.get("validation") or {}).get("tokens")
    val = TokenWindows(v["path"], v.get("dtype", dtype), seq_len) if v else None
    return train, val


def build_model(spec, sample_shape, out):
    """nn.Sequential equivalents of ddp's built-in models (trainer/model.h); nanoGPT's GPT."""
    import torch
    from torch import nn
    m = spec["model"]
    if "gpt" in m:
        return import_nanogpt().GPT(gpt_config(spec))
    if "torchscript" in m:
        return torch.jit.load(m["torchscript"]["path"])
    if "mlp" in m:
        hidden = (m["mlp"] or {}).get("hidden", [])
        layers, width = [nn.Flatten()], int(torch.tensor(sample_shape).prod())
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        return nn.Sequential(*layers, nn.Linear(width, out))
    c = m["cnn"] or {}
    channels, k, hidden = c.get("channels", [16, 32]), c.get("kernel", 5), c.get("hidden", 128)
    ch, h, w = sample_shape
    layers = []
    for co in channels:
        layers += [nn.Conv2d(ch, co, k, padding=k // 2), nn.ReLU(), nn.MaxPool2d(2)]
        ch, h, w = co, h // 2, w // 2
    layers += [nn.Flatten(), nn.Linear(ch * h * w, hidden), nn.ReLU(), nn.Linear(hidden, out)]
    return nn.Sequential(*layers)


def make_optimizer(opt, params, model=None):
    """train.optimizer over `params` (`model`, unused, is kept for callers that pass it):
    train.optimizer.weight_decay_params matrices makes nanoGPT's two groups, as
    tests/reference/nanogpt.py's GPT.param_groups() does."""
    import torch
    params = list(params)
    name = opt.get("name", "adam")
    weight_decay = opt.get("weight_decay", 0 if name in ("sgd", "adam") else 1e-2)
    if name == "sgd":
        cls = torch.optim.SGD
        kwargs = dict(lr=opt["lr"], momentum=opt.get("momentum", 0),
                      nesterov=opt.get("nesterov", False))
    else:
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        kwargs = dict(lr=opt.get("lr", 1e-3), betas=tuple(opt.get("betas", (0.9, 0.999))),
                      eps=opt.get("eps", 1e-8), amsgrad=opt.get("amsgrad", False))
    # train.optimizer.weight_decay_params: matrices is nanoGPT's configure_optimizers: the
    # parameters of 2 or more dimensions decay, the others do not (decay group first).
    if opt.get("weight_decay_params", "all") == "matrices":
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": weight_decay}]
    # train.optimizer.fused: torch.optim's fused=True; auto where every parameter is on a
    # GPU and this torch has the fused kernels (2.x), as ddp-trainer decides.
    fused = opt.get("fused", "auto")
    if fused == "auto":
        fused = (int(torch.__version__.split(".")[0]) >= 2 and bool(params)
                 and all(p.is_cuda for p in params))
    if fused:
        kwargs["fused"] = True
    if opt.get("zero_redundancy", False):
        # train.optimizer.zero_redundancy: PyTorch's ZeRO stage 1 over the same optimizer.
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(groups, optimizer_class=cls,
                                       parameters_as_bucket_view=False, **kwargs)
    return cls(groups, **kwargs)


def make_scheduler(spec, optimizer, total):
    """train.lr_schedule as torch.optim.lr_scheduler's own classes (docs/job-spec.md)."""
    from torch.optim import lr_scheduler as sch
    if not spec:
        return None
    name, warmup = spec["name"], spec.get("warmup", 0)
    t_max = spec.get("t_max", 0) or max(1, total - warmup)
    if name == "step":
        main = sch.StepLR(optimizer, step_size=spec.get("step_size", 1), gamma=spec.get("gamma", 0.1))
    elif name == "cosine":
        main = sch.CosineAnnealingLR(optimizer, T_max=t_max, eta_min=spec.get("eta_min", 0.0))
    elif name == "linear":
        main = sch.LinearLR(optimizer, start_factor=1.0, end_factor=spec.get("end_factor", 0.0),
                            total_iters=t_max)
    else:
        main = sch.ConstantLR(optimizer, factor=1.0, total_iters=0)
    if not warmup:
        return main
    first = sch.LinearLR(optimizer, start_factor=spec.get("warmup_start_factor", 0.1),
                         end_factor=1.0, total_iters=warmup)
    return sch.SequentialLR(optimizer, [first, main], milestones=[warmup])


def loss_fn(kind, out, y, reduction="mean"):
    import torch.nn.functional as F
    if isinstance(out, tuple):  # nanoGPT's GPT: (logits, loss)
        out = out[0]
    if kind == "cross_entropy":
        if out.dim() == 3:  # GPT: over every token, as nanoGPT
            return F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1), reduction=reduction)
        return F.cross_entropy(out, y, reduction=reduction)
    if kind == "mse":
        return F.mse_loss(out.reshape(-1), y, reduction=reduction)
    return F.binary_cross_entropy_with_logits(out.reshape(-1), y, reduction=reduction)


# train.precision: bf16 -> torch.autocast(device, torch.bfloat16) around each forward and
# its loss (training and validation), as ddp-trainer's Autocast; fp32 -> nothing.
AUTOCAST_DTYPE = None
DEVICE = None  # The rank's torch.device (train.device, as ddp-trainer picks it).


def autocast():
    import contextlib
    import torch
    if AUTOCAST_DTYPE is None:
        return contextlib.nullcontext()
    return torch.autocast(DEVICE.type, dtype=AUTOCAST_DTYPE)


def pick_device(spec):
    """ddp-trainer's choice of backend and device (docs/job-spec.md, train.device): cuda
    with nccl or auto -> NCCL, cuda with gloo -> Gloo's CUDA path, the GPU being
    cuda:(LOCAL_RANK mod visible GPUs); auto -> a GPU when the backend is nccl, or auto
    with a GPU visible; else the CPU over Gloo."""
    import torch
    backend = spec.get("backend", "auto")
    device = spec["train"].get("device", "auto")
    if device == "auto":
        device = "cuda" if backend == "nccl" or (backend == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cpu":
        return "gloo", torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("train.device cuda: this torch sees no GPU")
    gpu = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(gpu)
    return ("gloo" if backend == "gloo" else "nccl"), gpu


def validate(ddp, val, rank, world, batch_size, kind):
    """ddp-trainer's validation: rank r evaluates val[r::world] (no padding) through the
    DDP module in eval mode, in chunks of max(batch_size, 256); totals are all-reduced."""
    import torch
    import torch.distributed as dist
    vx, vy = val
    idx = torch.arange(rank, vx.shape[0], world)
    chunk = max(batch_size, 256)
    loss_sum, correct, count = 0.0, 0.0, 0.0
    ddp.eval()
    with torch.no_grad():
        for i in range(0, len(idx), chunk):
            sel = idx[i:i + chunk]
            bx, by = vx.index_select(0, sel).to(DEVICE), vy.index_select(0, sel).to(DEVICE)
            with autocast():
                out = ddp(bx)
                loss_sum += loss_fn(kind, out, by, reduction="sum").item()
            if kind == "cross_entropy":
                correct += out.argmax(1).eq(by).sum().item()
            elif kind == "bce_with_logits":
                correct += out.reshape(-1).gt(0).eq(by.gt(0.5)).sum().item()
            count += len(sel)
    ddp.train()
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=DEVICE)
    dist.all_reduce(totals)  # On the device: NCCL reduces CUDA tensors only.
    loss_sum, correct, count = totals.tolist()
    return loss_sum / count, (correct / count if kind != "mse" else None)


def validate_tokens(ddp, val, rank, world, batch_size):
    """ddp-trainer's validation of data.validation.tokens: rank r evaluates windows
    [r::world] in batches of train.batch_size; loss and accuracy are per token."""
    import torch
    import torch.distributed as dist
    idx = list(range(rank, len(val), world))
    loss_sum, correct, tokens = 0.0, 0.0, 0.0
    ddp.eval()
    with torch.no_grad():
        for i in range(0, len(idx), batch_size):
            bx, by = [torch.stack(t) for t in zip(*(val[j] for j in idx[i:i + batch_size]))]
            bx, by = bx.to(DEVICE), by.to(DEVICE)
            with autocast():
                logits = ddp(bx)[0]
                loss_sum += loss_fn("cross_entropy", logits, by, reduction="sum").item()
            correct += logits.argmax(-1).eq(by).sum().item()
            tokens += by.numel()
    ddp.train()
    totals = torch.tensor([loss_sum, correct, tokens], dtype=torch.float64, device=DEVICE)
    dist.all_reduce(totals)
    loss_sum, correct, tokens = totals.tolist()
    return loss_sum / tokens, correct / tokens


# ---------------------------------------------------------------- one rank

def child(args):
    import contextlib
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    spec, opt = load_spec(args.spec)
    os.chdir(os.path.dirname(os.path.abspath(args.spec)))
    global AUTOCAST_DTYPE, DEVICE
    train = spec["train"]
    if train.get("precision", "fp32") == "bf16":
        AUTOCAST_DTYPE = torch.bfloat16
    threads = args.threads or train.get("threads") or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    tokens = "tokens" in spec["data"]
    if tokens:
        dataset, val = load_tokens(spec)
        x, num_classes = None, 0
    else:
        x, y, val, num_classes = load_data(spec, train["loss"])
        dataset = TensorDataset(x, y)
    torch.manual_seed(train["seed"])
    out = num_classes if train["loss"] == "cross_entropy" else 1
    model = build_model(spec, list(x.shape[1:]) if x is not None else [], out)
    backend, DEVICE = pick_device(spec)
    dist.init_process_group(backend, rank=rank, world_size=world)
    ddp = DDP(model.to(DEVICE), bucket_cap_mb=train["bucket_cap_mb"],
              device_ids=[DEVICE] if DEVICE.type == "cuda" else None)
    optimizer = make_optimizer(opt, ddp.parameters(), model)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                 shuffle=train["shuffle"], seed=train["seed"], drop_last=False)
    loader = DataLoader(dataset, batch_size=train["batch_size"], sampler=sampler,
                        drop_last=train["drop_last"])
    accum = train["grad_accum_steps"]
    max_steps = args.max_steps or train["max_steps"]
    clip = train.get("clip_grad_norm", 0)
    schedule = train.get("lr_schedule")
    by_epoch = bool(schedule) and schedule.get("interval", "step") == "epoch"
    steps_per_epoch = math.ceil(len(loader) / accum)
    intervals = train["epochs"] if by_epoch else train["epochs"] * steps_per_epoch
    if max_steps and not by_epoch:
        intervals = min(intervals, max_steps)
    scheduler = make_scheduler(schedule, optimizer, intervals)
    losses, epochs, samples, global_step, validate_s = [], [], 0, 0, 0.0
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(train["epochs"]):
        sampler.set_epoch(epoch)
        if args.index_loader:
            order = torch.tensor(list(iter(sampler)))
            bs = train["batch_size"]
            cuts = range(0, len(order) - (len(order) % bs if train["drop_last"] else 0), bs)
            if tokens:
                batches = [tuple(torch.stack(t) for t in zip(*(dataset[j] for j in order[i:i + bs])))
                           for i in cuts]
            else:
                batches = [(x.index_select(0, order[i:i + bs]), y.index_select(0, order[i:i + bs]))
                           for i in cuts]
        else:
            batches = list(loader)
        steps = math.ceil(len(batches) / accum)
        for step in range(steps):
            group = batches[step * accum:(step + 1) * accum]
            total = 0.0
            for j, (bx, by) in enumerate(group):
                bx, by = bx.to(DEVICE), by.to(DEVICE)
                sync = j == len(group) - 1
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    with autocast():
                        loss = loss_fn(train["loss"], ddp(bx), by)
                    (loss if len(group) == 1 else loss / len(group)).backward()
                total += loss.item()
                samples += bx.shape[0]
            if clip:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None and not by_epoch:
                scheduler.step()
            losses.append([epoch, step, total / len(group)])
            global_step += 1
            if max_steps and global_step >= max_steps:
                break
        if scheduler is not None and by_epoch:
            scheduler.step()
        if tokens and val is not None:
            t0 = time.perf_counter()
            val_loss, val_accuracy = validate_tokens(ddp, val, rank, world, train["batch_size"])
            epochs.append([epoch, val_loss, val_accuracy])
            validate_s += time.perf_counter() - t0
        elif val is not None and len(val[0]) > 0:
            t0 = time.perf_counter()
            val_loss, val_accuracy = validate(ddp, val, rank, world, train["batch_size"],
                                              train["loss"])
            epochs.append([epoch, val_loss, val_accuracy])
            validate_s += time.perf_counter() - t0
        if max_steps and global_step >= max_steps:
            break
    wall = time.perf_counter() - start - validate_s
    fingerprint = [p.detach().sum().item() for p in ddp.module.parameters()]
    dist.barrier()
    dist.destroy_process_group()
    import resource
    print(json.dumps({"rank": rank, "backend": backend, "device": str(DEVICE),
                      "losses": losses, "epochs": epochs, "samples": samples,
                      "train_s": wall, "threads": threads, "param_sums": fingerprint,
                      "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}),
          flush=True)
    # Skip interpreter teardown: with Debian's torch 1.13 on Python 3.11, destroying
    # DDP's reducer at exit can deadlock (a Gloo work thread waits for the GIL while
    # the main thread joins it), seen as a rank spinning forever after its output.
    os._exit(0)


def main():
    args = parse_args()
    if args.child:
        child(args)
        return
    port = free_port()
    # The ranks are forked from this process once it has imported torch (and run nothing
    # in it), not started afresh: a new interpreter imports torch again, seconds of CPU
    # per rank, and the ranks' numbers are the same either way. Each writes its JSON to
    # a pipe of its own, as its stdout; --child still runs one rank alone.
    import torch  # noqa: F401
    procs = []
    for rank in range(args.world):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            os.dup2(write_end, 1)
            os.close(write_end)
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            try:
                child(args)  # Ends with os._exit(0).
            except BaseException:
                import traceback
                traceback.print_exc()
            os._exit(1)
        os.close(write_end)
        procs.append((pid, read_end))
    ranks = {}
    for rank, (pid, read_end) in enumerate(procs):
        with os.fdopen(read_end, "rb") as f:
            stdout = f.read()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            sys.exit(f"rank {rank} failed with exit code {code}")
        ranks[str(rank)] = json.loads(stdout.decode().strip().splitlines()[-1])
    result = {"torch": torch.__version__, "world": args.world,
              "spec": os.path.basename(args.spec), "ranks": ranks}
    with open(args.out, "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
