#!/usr/bin/python3
"""PyTorch's own SyncBatchNorm on the setup of sync_batch_norm_program.cc.

    python3 tests/libddp/sync_batch_norm_reference.py WORLD MODEL [cuda] > out.json

A Sequential model (mlp: Linear, BatchNorm1d, ReLU, Linear; conv: Conv2d, BatchNorm2d
with momentum=None, ReLU, Flatten, Linear; plain: Conv1d, BatchNorm1d without affine
parameters or running statistics, ReLU, Flatten, Linear) goes through
torch.nn.SyncBatchNorm.convert_sync_batchnorm, then trains under DistributedDataParallel
(Gloo) on WORLD ranks with different batch sizes per rank (one rank holds a single row
in one step, another none in another). Prints, per rank, the
per-step losses, the converted layer's running statistics and the eval loss.

PyTorch runs SyncBatchNorm on GPUs only: its module refuses CPU inputs, and ATen has the
five per-channel kernels its autograd Function calls (batch_norm_stats,
batch_norm_gather_stats_with_counts, batch_norm_elemt, batch_norm_backward_reduce,
batch_norm_backward_elemt) for CUDA only. So that PyTorch's module and Function run
unchanged on the CPU, this script (1) removes that one device check from
SyncBatchNorm.forward's source (asserting it found it) and DistributedDataParallel's
refusal of SyncBatchNorm on a CPU module (_passing_sync_batchnorm_handle, which only
checks), and (2) supplies the five kernels for CPU tensors, computing what the CUDA
kernels compute. check_kernels() proves those
kernels right against PyTorch's CPU batch norm on the concatenated global batch
(outputs, gradients, running statistics) before anything else runs.
"""
import inspect
import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ddp_test_ports import claim_port  # noqa: E402 (tests/common/ddp_test_ports.py)

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.modules.batchnorm as batchnorm

N, CLASSES, STEPS = 200, 3, 6


# --- The five kernels for CPU tensors (the CUDA kernels' arithmetic, sums in double).

def _dims(t):
    return [0] + list(range(2, t.dim()))


def _per_channel(v, like):
    shape = [1] * like.dim()
    shape[1] = -1
    return v.view(shape)


def _stat_type(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def stats(input, eps):
    x = input.double()
    mean = x.mean(_dims(x))
    var = (x - _per_channel(mean, x)).pow(2).mean(_dims(x))
    invstd = (var + eps).rsqrt()
    if eps == 0:
        invstd = torch.where(var == 0, torch.zeros_like(invstd), invstd)
    return mean.to(_stat_type(input)), invstd.to(_stat_type(input))


def gather_stats_with_counts(input, mean_all, invstd_all, running_mean, running_var,
                             momentum, eps, counts):
    m = mean_all.double()
    sd = invstd_all.double().reciprocal()
    n_j = counts.double().unsqueeze(1)
    var_j = sd * sd - eps
    n = n_j.sum()
    mean = (n_j * m).sum(0) / n
    var_n = (n_j * (var_j + (m - mean).pow(2))).sum(0)
    invstd = (var_n / n + eps).rsqrt()
    if running_mean is not None:
        running_mean.copy_(running_mean.double() * (1 - momentum) + mean * momentum)
    if running_var is not None:
        running_var.copy_(running_var.double() * (1 - momentum) + var_n / (n - 1) * momentum)
    return mean.to(mean_all.dtype), invstd.to(mean_all.dtype)


def elemt(input, weight, bias, mean, invstd, eps):
    x = input.to(mean.dtype)
    out = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        out = out * _per_channel(weight.to(mean.dtype), x)
    if bias is not None:
        out = out + _per_channel(bias.to(mean.dtype), x)
    return out.to(input.dtype)


def backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    dy, x = grad_out.double(), input.double()
    sum_dy = dy.sum(_dims(x))
    sum_dy_xmu = (dy * (x - _per_channel(mean.double(), x))).sum(_dims(x))
    wtype = weight.dtype if weight is not None else input.dtype
    grad_weight = (sum_dy_xmu * invstd.double()).to(wtype) if weight_g else None
    grad_bias = sum_dy.to(wtype) if bias_g else None
    return sum_dy.to(mean.dtype), sum_dy_xmu.to(mean.dtype), grad_weight, grad_bias


def backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    acc = mean.dtype
    norm = 1.0 / count.sum().item()
    dy, x = grad_out.to(acc), input.to(acc)
    m_dy = sum_dy * norm
    factor_1 = invstd * invstd * sum_dy_xmu * norm
    factor_2 = weight.to(acc) * invstd if weight is not None else invstd
    grad = (dy - _per_channel(m_dy, x) - (x - _per_channel(mean, x)) * _per_channel(factor_1, x)) \
        * _per_channel(factor_2, x)
    return grad.to(input.dtype)


def install_cpu_kernels():
    for name, cpu in [("batch_norm_stats", stats),
                      ("batch_norm_gather_stats_with_counts", gather_stats_with_counts),
                      ("batch_norm_elemt", elemt),
                      ("batch_norm_backward_reduce", backward_reduce),
                      ("batch_norm_backward_elemt", backward_elemt)]:
        native = getattr(torch, name)

        def kernel(*args, _native=native, _cpu=cpu):
            return _native(*args) if args[0].is_cuda else _cpu(*args)
        setattr(torch, name, kernel)


def allow_cpu_inputs():
    """SyncBatchNorm.forward's source less its one device check (1.13: `if not
    input.is_cuda: raise`; 2.x: `if input.device.type not in [...]: raise`)."""
    src = textwrap.dedent(inspect.getsource(nn.SyncBatchNorm.forward))
    lines = src.split("\n")
    start = [i for i, l in enumerate(lines)
             if l.strip() in ("if not input.is_cuda:", "if input.device.type not in [")]
    assert len(start) == 1, "SyncBatchNorm.forward's device check not found"
    i = start[0]
    end = next(j for j in range(i, len(lines)) if lines[j].strip().startswith("raise ValueError"))
    end = next(j for j in range(end, len(lines)) if lines[j].strip().endswith(")"))
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    lines[i:end + 1] = [indent + "pass  # device check removed: CPU inputs run as CUDA's"]
    scope = dict(vars(batchnorm))
    exec(compile("\n".join(lines), batchnorm.__file__, "exec"), scope)
    nn.SyncBatchNorm.forward = scope["forward"]
    ddp_class = nn.parallel.DistributedDataParallel
    assert hasattr(ddp_class, "_passing_sync_batchnorm_handle")
    ddp_class._passing_sync_batchnorm_handle = lambda self, module: None
    if not torch.cuda.is_available():
        # 1.13's Function asks whether a CUDA graph is being captured, which a CPU-only
        # torch cannot answer: none is.
        torch.cuda.is_current_stream_capturing = lambda: False


def check_kernels():
    """The five kernels, composed as PyTorch's Function composes them over ranks of
    uneven sizes, equal plain batch norm over the whole batch (float64)."""
    torch.manual_seed(5)
    chunks = [torch.randn(n, 3, 4, dtype=torch.float64) for n in (2, 5, 1)]
    w = torch.rand(3, dtype=torch.float64)
    b = torch.rand(3, dtype=torch.float64)
    eps, momentum = 1e-5, 0.3
    whole = torch.cat(chunks).requires_grad_()
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    rm_ref, rv_ref = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    y_ref = F.batch_norm(whole, rm_ref, rv_ref, wr, br, True, momentum, eps)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    dys = dy.split([c.shape[0] for c in chunks])
    gathered = [stats(c, eps) for c in chunks]
    counts = torch.tensor([float(c.numel() // c.size(1)) for c in chunks], dtype=torch.float64)
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    mean, invstd = gather_stats_with_counts(chunks[0], torch.stack([g[0] for g in gathered]),
                                            torch.stack([g[1] for g in gathered]), rm, rv,
                                            momentum, eps, counts)
    y = torch.cat([elemt(c, w, b, mean, invstd, eps) for c in chunks])
    reduced = [backward_reduce(d, c, mean, invstd, w, True, True, True)
               for d, c in zip(dys, chunks)]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    gx = torch.cat([backward_elemt(d, c, mean, invstd, w, sum_dy, sum_dy_xmu,
                                   counts.to(torch.int32)) for d, c in zip(dys, chunks)])
    for got, want in [(y, y_ref), (rm, rm_ref), (rv, rv_ref), (gx, whole.grad),
                      (sum(r[2] for r in reduced), wr.grad), (sum(r[3] for r in reduced), br.grad)]:
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), (got, want)


def batch_size(rank, step, world):
    if step == 2 and rank == world - 1 and world > 1:
        return 1
    if step == 4 and rank == 0 and world > 1:
        return 0
    return 5 + 2 * rank


def make_model(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(),
                             nn.Linear(16, CLASSES))
    if kind == "plain":
        return nn.Sequential(nn.Conv1d(2, 4, 3, padding=1),
                             nn.BatchNorm1d(4, affine=False, track_running_stats=False),
                             nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6, CLASSES))
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=None),
                         nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, CLASSES))


def run(rank, world, kind, port, out, device="cpu"):
    if device == "cpu":
        install_cpu_kernels()
        allow_cpu_inputs()
    else:  # PyTorch unchanged, on one GPU shared by the ranks (Gloo's CUDA path).
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.SyncBatchNorm.convert_sync_batchnorm(make_model(kind))
    assert isinstance(net[1], nn.SyncBatchNorm)
    torch.manual_seed(1)
    x_all = torch.randn(N, 10) if kind == "mlp" else \
        torch.randn(N, 2, 6) if kind == "plain" else torch.randn(N, 2, 5, 5)
    y_all = torch.randint(0, CLASSES, (N,))
    net, x_all, y_all = net.to(device), x_all.to(device), y_all.to(device)
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, offset = [], 0
    model.train()
    for step in range(STEPS):
        begin = offset + sum(batch_size(r, step, world) for r in range(rank))
        offset += sum(batch_size(r, step, world) for r in range(world))
        n = batch_size(rank, step, world)
        loss = F.cross_entropy(model(x_all[begin:begin + n]), y_all[begin:begin + n])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        eval_loss = F.cross_entropy(model(x_all), y_all).item()
    bn = net[1]
    tracked = bn.track_running_stats
    out[rank] = {"losses": losses,
                 "running_mean": bn.running_mean.tolist() if tracked else [],
                 "running_var": bn.running_var.tolist() if tracked else [],
                 "num_batches_tracked": int(bn.num_batches_tracked) if tracked else -1,
                 "eval_loss": eval_loss}
    dist.destroy_process_group()


def free_port():
    # A port of this process's own, claimed against tests run beside it (ctest -j).
    return claim_port()


def main():
    world, kind = int(sys.argv[1]), sys.argv[2]
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    # One thread before any kernel runs here: no OpenMP pool exists when the ranks are
    # forked from this process (a forked child cannot use its parent's pool).
    torch.set_num_threads(1)
    check_kernels()
    with mp.Manager() as manager:
        out = manager.dict()
        # Forked from this process, which has imported torch already (and run only the
        # one-thread kernel check above), rather than spawned: a spawned rank imports
        # torch again, seconds of CPU each, and the numbers are the same. On a GPU,
        # spawned: CUDA cannot be used in a forked child of a process that touched it.
        mp.start_processes(run, args=(world, kind, free_port(), out, device), nprocs=world,
                           start_method="fork" if device == "cpu" else "spawn")
        ranks = [out[r] for r in range(world)]
    json.dump({"torch": torch.__version__, "ranks": ranks}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
