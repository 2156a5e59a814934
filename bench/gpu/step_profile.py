"""Where a training step's time goes, from torch.profiler: the GPU's kernels by kind.

    with torch.profiler.profile(activities=activities(device)) as prof:
        ...N steps, the device synchronized before and after...
    table = summarize(prof, wall_s, N)

`summarize` returns, per step: the wall time, the GPU's kernel time (every kernel, memcpy
and memset the profiler saw on the device), the GPU busy share (the union of those
intervals over the wall time: overlapping kernels on two streams count once), the kernel
time by kind (`kind_of`), and the ten kernels that took the longest. On the CPU (no device
events) it gives the ten operators with the most self CPU time instead. bench/gpu/bench.py
prints it beside each GPT side (`--gpt-profile N`).
"""

# First match wins: the fused kernels torch.compile writes (Triton) before the kinds their
# names also mention.
KINDS = (
    ("NCCL", ("nccl",)),
    ("Triton (fused by torch.compile)", ("triton",)),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "cublas", "matmul", "nvjet", "wgmma")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "sgd")),
    ("LayerNorm", ("layer_norm", "layernorm")),
    ("GELU", ("gelu",)),
    ("softmax and cross-entropy", ("softmax", "nll_loss", "cross_entropy")),
    ("memcpy and memset", ("memcpy", "memset")),
)
OTHER = "elementwise and other"


def kind_of(name):
    low = name.lower()
    for kind, marks in KINDS:
        if any(m in low for m in marks):
            return kind
    return OTHER


def activities(device_type):
    import torch.profiler as tp
    acts = [tp.ProfilerActivity.CPU]
    if device_type == "cuda":
        acts.append(tp.ProfilerActivity.CUDA)
    return acts


def union_us(intervals):
    """The length of the union of (start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarize_events(device_events, wall_s, steps, top=10):
    """device_events: (name, start_us, end_us) of every kernel, memcpy and memset."""
    steps = max(1, steps)
    by_kind, by_name = {}, {}
    for name, s, e in device_events:
        d = e - s
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + d
        t, n = by_name.get(name, (0.0, 0))
        by_name[name] = (t + d, n + 1)
    kernel_us = sum(by_kind.values())
    busy_us = union_us([(s, e) for _, s, e in device_events])
    wall_us = wall_s * 1e6
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_us / steps / 1e3, 3),
        "kernel_ms_per_step": round(kernel_us / steps / 1e3, 3),
        "busy_pct": round(100 * busy_us / wall_us, 1) if wall_us > 0 else None,
        "kinds_ms_per_step": {k: round(v / steps / 1e3, 3)
                              for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [[name[:120], round(t / steps / 1e3, 3), round(n / steps, 1)]
                        for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def summarize(prof, wall_s, steps, top=10):
    from torch.autograd import DeviceType
    device_events = []
    for e in prof.events():
        if e.device_type != DeviceType.CPU:
            device_events.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    if device_events:
        return summarize_events(device_events, wall_s, steps, top)
    steps = max(1, steps)
    ops = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:top]
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_s * 1e3 / steps, 3),
        "note": "no device events (the CPU): the operators with the most self CPU time",
        "top_cpu_ops": [[a.key[:120], round(a.self_cpu_time_total / steps / 1e3, 3),
                         round(a.count / steps, 1)] for a in ops],
    }
