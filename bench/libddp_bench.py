#!/usr/bin/python3
"""Benchmark: libddp, the engine as a library, against PyTorch and against ddp-trainer.

    /usr/bin/python3 bench/libddp_bench.py [--repeats 3] [--limit 6000] [--batch-sizes 64,32]
                                          [--out bench/results/libddp.json]

1. examples/cpp's program (a residual CNN on Fashion-MNIST, built as
   build/bin/ddp-bench-fashion-resnet) against the same model, data, sampler, batch,
   optimizer and schedule in PyTorch's Python DDP (bench/fashion_resnet.py, Debian's
   torch 1.13): seconds of each epoch's training loop, 2 ranks (Gloo), one intra-op thread
   each, in one run, at each batch size of --batch-sizes (the example's default is 64;
   smaller batches make the per-step overhead a larger share of the step).
2. The library's overhead over the built-in trainer: bench/jobs/mlp85k.yaml's training
   (64-256-256-10 MLP, batch 32, Adam) run by ddp-trainer and written as a user's program
   on the public API (build/bin/ddp-bench-libddp-mlp), 2 ranks: samples per second of the
   training loop (all ranks' samples / the slowest rank's loop time).
Both sides of a comparison run back to back within a repeat (their order alternating
between repeats), and the figures are the medians over --repeats of each side and of the
per-repeat ratios: on a shared machine whose speed drifts between repeats, the paired
ratio is the figure that holds.

    /usr/bin/python3 bench/libddp_bench.py --before OLD/build/bin [--after NEW/bin] [--repeats 7]
                                          [--out bench/results/libddp_before_after.json]

runs comparison 2 alone for two builds in one run (a change's "before" build's bin/ and
this tree's build/bin), the four programs in rotated order within each repeat: each
build's library overhead, and each program's throughput after over before.

    python3 bench/libddp_bench.py --flavour torch2 --resnet-only \
        [--repeats 7] [--batch-sizes 64] [--workers 1] [--out bench/results/libddp_torch2.json]

runs comparison 1 with the PyPI flavour: the example built in build-torch2 (against
torch 2.11's LibTorch) and bench/fashion_resnet.py under .venv-torch2's torch 2.11, so
that both sides run the same ATen; --workers is the example's loader threads per rank
(its --workers; 0: the loader fetches in the training thread). The figures add
samples/s (the rank's samples per epoch over its seconds, times the world size).
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys

from benchkit import free_port  # noqa: E402  (bench/benchkit.py: the tests' ports)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
PYTHON = "/usr/bin/python3"
# --flavour torch2: the build against PyPI's torch 2.11 and that torch's Python.
FLAVOURS = {"debian": (BIN, PYTHON),
            "torch2": (os.path.join(ROOT, "build-torch2", "bin"),
                       os.path.join(ROOT, ".venv-torch2", "bin", "python"))}
WORKERS = None  # The example's --workers (None: its default).
WORLD = 2
# As bench/trainer_vs_pytorch.py: keep glibc from returning memory every step (both sides).
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "1000000000",
                "MALLOC_TOP_PAD_": "100000000"}


def run_ranks(argv, cwd=ROOT):
    """Runs WORLD ranks of argv with torchrun's environment; returns their stdouts."""
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                   LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **TUNED_MALLOC)
        env.pop("DDP_EVENTS_FD", None)
        procs.append(subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"{argv[0]} failed ({p.returncode}):\n{err.decode()[-2000:]}")
        outs.append(out.decode())
    return outs


def epoch_seconds(out):
    """The seconds of each epoch's loop, from rank 0's "epoch E: ..., S s" lines."""
    return [float(m) for m in re.findall(r"^epoch \d+: .*?([0-9.]+) s$", out, re.M)]


def resnet(limit, epochs, batch, libddp_first=True):
    args = ["--data", "/usr/share/datasets/fashion-mnist", "--epochs", str(epochs),
            "--limit", str(limit), "--threads", "1", "--batch-size", str(batch)]
    lib_args = args + (["--workers", str(WORKERS)] if WORKERS is not None else [])

    def lib():
        return epoch_seconds(
            run_ranks([os.path.join(BIN, "ddp-bench-fashion-resnet")] + lib_args)[0])

    def py():
        return epoch_seconds(
            run_ranks([PYTHON, os.path.join(ROOT, "bench", "fashion_resnet.py")] + args)[0])

    if libddp_first:
        lib_s = lib()
        py_s = py()
    else:
        py_s = py()
        lib_s = lib()
    return lib_s, py_s


def throughput_trainer(bin_dir=BIN):
    spec = os.path.join(ROOT, "bench", "jobs", "mlp85k.yaml")
    outs = run_ranks([os.path.join(bin_dir, "ddp-trainer"), "--spec", spec],
                     cwd=os.path.dirname(spec))
    done = [json.loads([l for l in o.splitlines() if '"type":"done"' in l][-1]) for o in outs]
    return sum(d["samples"] for d in done) / max(d["train_s"] for d in done)


def throughput_library(bin_dir=BIN):
    outs = run_ranks([os.path.join(bin_dir, "ddp-bench-libddp-mlp"), "3"])
    done = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return sum(d["samples"] for d in done) / max(d["train_s"] for d in done)


def before_after(before_bin, repeats, out, after_bin=None):
    """Comparison 2 for two builds, interleaved: {build: {program: [samples/s]}}."""
    bins = {"before": os.path.abspath(before_bin), "after": os.path.abspath(after_bin or BIN)}
    runs = [(build, prog) for build in bins for prog in ("ddp-trainer", "libddp")]
    tp = {build: {"ddp-trainer": [], "libddp": []} for build in bins}
    for r in range(repeats):
        order = runs[r % len(runs):] + runs[:r % len(runs)]  # Rotate who goes first.
        for build, prog in order:
            f = throughput_trainer if prog == "ddp-trainer" else throughput_library
            tp[build][prog].append(f(bins[build]))
        print(f"repeat {r + 1}: " + "; ".join(
            f"{b} {p} {tp[b][p][-1]:,.0f}" for b in bins for p in tp[b]), flush=True)

    def paired_median(xs, ys):
        return round(statistics.median(100.0 * (x / y - 1.0) for x, y in zip(xs, ys)), 2)

    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "world_size": WORLD, "repeats": repeats, "job": "bench/jobs/mlp85k.yaml",
        "bins": bins,
        "samples_per_s_median": {b: {p: round(statistics.median(v)) for p, v in tp[b].items()}
                                 for b in bins},
        "samples_per_s": {b: {p: [round(x) for x in v] for p, v in tp[b].items()} for b in bins},
        # ddp-trainer over the libddp program, minus 1, in each build (median of paired).
        "library_overhead_pct": {b: paired_median(tp[b]["ddp-trainer"], tp[b]["libddp"])
                                 for b in bins},
        # Each program after over before, minus 1 (median of paired).
        "after_over_before_pct": {p: paired_median(tp["after"][p], tp["before"][p])
                                  for p in ("ddp-trainer", "libddp")},
    }
    print(json.dumps(result, indent=1))
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", help="another build's bin/: comparison 2, before and after")
    ap.add_argument("--after", help="with --before: the after build's bin/ (default build/bin)")
    ap.add_argument("--limit", type=int, default=6000, help="Fashion-MNIST training images")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-sizes", default="64,32")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "libddp.json"))
    ap.add_argument("--flavour", choices=sorted(FLAVOURS), default="debian",
                    help="torch2: build-torch2's programs and .venv-torch2's torch 2.11")
    ap.add_argument("--workers", type=int, help="the example's loader threads (--workers)")
    ap.add_argument("--resnet-only", action="store_true", help="comparison 1 alone")
    a = ap.parse_args()
    global BIN, PYTHON, WORKERS
    BIN, PYTHON = FLAVOURS[a.flavour]
    WORKERS = a.workers
    if a.before:
        out = a.out
        if out == ap.get_default("out"):
            out = os.path.join(ROOT, "bench", "results", "libddp_before_after.json")
        return before_after(a.before, a.repeats, out, a.after)
    batches = [int(b) for b in a.batch_sizes.split(",")]
    lib_s = {b: [] for b in batches}
    py_s = {b: [] for b in batches}
    trainer_tp, library_tp = [], []
    for r in range(a.repeats):
        line = f"repeat {r + 1}:"
        for b in batches:
            lib, py = resnet(a.limit, a.epochs, b, libddp_first=r % 2 == 0)
            lib_s[b].append(statistics.mean(lib))
            py_s[b].append(statistics.mean(py))
            line += f" resnet batch {b} s/epoch libddp {lib_s[b][-1]:.3f} pytorch {py_s[b][-1]:.3f};"
        if a.resnet_only:
            print(line, flush=True)
            continue
        if r % 2 == 0:
            trainer_tp.append(throughput_trainer())
            library_tp.append(throughput_library())
        else:
            library_tp.append(throughput_library())
            trainer_tp.append(throughput_trainer())
        print(f"{line} mlp85k samples/s ddp-trainer {trainer_tp[-1]:,.0f} "
              f"libddp {library_tp[-1]:,.0f}", flush=True)
    # Samples per epoch over all ranks: each rank's share of the sampler (padded).
    samples = -(-a.limit // WORLD) * WORLD
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "world_size": WORLD,
        "repeats": a.repeats,
        "flavour": a.flavour,
        "torch": subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                                capture_output=True, text=True).stdout.strip(),
        "example_workers": WORKERS,
        "fashion_resnet": [
            {"batch_size": b, "train_images": a.limit, "epochs": a.epochs,
             "libddp_s_per_epoch": round(statistics.median(lib_s[b]), 3),
             "pytorch_ddp_s_per_epoch": round(statistics.median(py_s[b]), 3),
             "libddp_samples_per_s": round(samples / statistics.median(lib_s[b])),
             "pytorch_ddp_samples_per_s": round(samples / statistics.median(py_s[b])),
             "speedup_median_of_paired": round(
                 statistics.median(p / l for p, l in zip(py_s[b], lib_s[b])), 3),
             "speedups": [round(p / l, 3) for p, l in zip(py_s[b], lib_s[b])]}
            for b in batches],
    }
    if not a.resnet_only:
        tr_m, li_m = statistics.median(trainer_tp), statistics.median(library_tp)
        result["mlp85k"] = {
            "ddp_trainer_samples_per_s": round(tr_m), "libddp_samples_per_s": round(li_m),
            "library_overhead_pct_median_of_paired": round(
                statistics.median(100.0 * (t / l - 1.0) for t, l in zip(trainer_tp, library_tp)),
                2),
            "library_overhead_pct": [round(100.0 * (t / l - 1.0), 2)
                                     for t, l in zip(trainer_tp, library_tp)]}
    print(json.dumps(result, indent=1))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
