"""On a machine with a GPU: the CPU arithmetic that libddp's SyncBatchNorm and
sync_batch_norm_reference.py use against PyTorch's CUDA kernels and PyTorch's own
SyncBatchNorm on CUDA (a manual check, not part of CI, which has no GPU).

    python3 tests/libddp/sync_batch_norm_gpu_check.py

1. Each of the five kernels (batch_norm_stats, batch_norm_gather_stats_with_counts,
   batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt) on the same
   float32 inputs, CPU stand-in against CUDA: the largest difference of each.
2. sync_batch_norm_reference.py's training (2 and 3 ranks, both models) on the CPU with
   the stand-ins against unmodified PyTorch on CUDA: the largest loss and running
   statistics differences. Exits 1 when any is above 1e-5.
"""
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sync_batch_norm_reference as ref  # noqa: E402

TOL = 1e-5


def diff(a, b):
    if a is None and b is None:
        return 0.0
    return (a.double().cpu() - b.double().cpu()).abs().max().item()


def kernels():
    torch.manual_seed(3)
    worst = 0.0
    for shape in [(7, 16), (5, 4, 6, 6)]:
        chunks = [torch.randn(n, *shape[1:]) * 3 + 1 for n in (shape[0], 2, 1)]
        c = shape[1]
        w, b = torch.rand(c), torch.rand(c)
        eps, mom = 1e-5, 0.1
        out = {}
        for dev in ("cpu", "cuda"):
            cs = [x.to(dev) for x in chunks]
            st = [(ref.stats if dev == "cpu" else torch.batch_norm_stats)(x, eps) for x in cs]
            counts = torch.tensor([float(x.numel() // c) for x in cs], device=dev)
            rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
            gather = ref.gather_stats_with_counts if dev == "cpu" else \
                torch.batch_norm_gather_stats_with_counts
            mean, invstd = gather(cs[0], torch.stack([s[0] for s in st]),
                                  torch.stack([s[1] for s in st]), rm, rv, mom, eps, counts)
            elemt = ref.elemt if dev == "cpu" else torch.batch_norm_elemt
            y = elemt(cs[0], w.to(dev), b.to(dev), mean, invstd, eps)
            dy = torch.randn(cs[0].shape, generator=torch.Generator().manual_seed(9)).to(dev)
            reduce = ref.backward_reduce if dev == "cpu" else torch.batch_norm_backward_reduce
            sdy, sdyx, gw, gb = reduce(dy, cs[0], mean, invstd, w.to(dev), True, True, True)
            belemt = ref.backward_elemt if dev == "cpu" else torch.batch_norm_backward_elemt
            gx = belemt(dy, cs[0], mean, invstd, w.to(dev), sdy * 3, sdyx * 3,
                        counts.to(torch.int32))
            out[dev] = dict(stats_mean=st[1][0], stats_invstd=st[1][1], mean=mean,
                            invstd=invstd, running_mean=rm, running_var=rv, elemt=y,
                            sum_dy=sdy, sum_dy_xmu=sdyx, grad_weight=gw, grad_bias=gb,
                            grad_input=gx)
        for name in out["cpu"]:
            d = diff(out["cpu"][name], out["cuda"][name])
            scale = out["cuda"][name].abs().max().item() or 1.0
            print(f"kernel {shape} {name}: max |cpu - cuda| = {d:.3g} (relative {d / scale:.3g})")
            worst = max(worst, d / max(scale, 1.0))
    return worst


def training():
    worst = 0.0
    for world in (2, 3):
        for kind in ("mlp", "conv"):
            runs = {}
            for dev in ("cpu", "cuda"):
                p = subprocess.run([sys.executable, os.path.join(HERE, "sync_batch_norm_reference.py"),
                                    str(world), kind, dev], capture_output=True, text=True)
                assert p.returncode == 0, p.stderr[-3000:]
                runs[dev] = json.loads(p.stdout)["ranks"]
            d = 0.0
            for a, b in zip(runs["cpu"], runs["cuda"]):
                for key in ("losses", "running_mean", "running_var"):
                    d = max(d, max(abs(x - y) for x, y in zip(a[key], b[key])))
                d = max(d, abs(a["eval_loss"] - b["eval_loss"]))
                assert a["num_batches_tracked"] == b["num_batches_tracked"]
            print(f"training world {world} {kind}: max |cpu stand-ins - PyTorch on CUDA| = {d:.3g}")
            worst = max(worst, d)
    return worst


if __name__ == "__main__":
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    k = kernels()
    t = training()
    print(f"worst: kernels (relative) {k:.3g}, training {t:.3g}")
    sys.exit(0 if k <= TOL and t <= TOL else 1)
