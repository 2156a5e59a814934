"""The GPU bench: ddp-trainer and a libddp program against PyTorch's Python DDP on one GPU.

    python3 bench/gpu/bench.py --build BUILD_DIR --out OUT_DIR [--repeats 1]
                               [--models mlp,cnn,resnet18] [--dry-run]

For each model of bench/gpu/models.py (a small MLP, the Fashion-MNIST CNN, ResNet-18) and
each configuration
  nccl-w1   world 1 on NCCL (the GPU machine has one GPU; NCCL refuses two ranks on one)
  gloo-w2   world 2 on the same GPU over Gloo's CUDA path
three sides train the same architecture, data shape, batch, SGD and steps, one after the
other (their order rotating):
  pytorch      torch.nn.parallel.DistributedDataParallel (bench/gpu/pytorch_ddp.py), eager
  libddp       a program on libddp's public API (ddp-bench-gpu), the model in TorchScript
  ddp-trainer  the built-in trainer, model.torchscript and data.synthetic (job.yaml)
Each reports samples per second over the steps after the first --warmup (summed over
ranks); nvidia-smi, sampled every 200 ms during the run, gives the GPU's mean
utilization and its peak memory used. Results: OUT_DIR/gpu_bench.json and
OUT_DIR/gpu_bench.md (the table for docs/benchmarks.md).

--dry-run does all of it on the CPU (Gloo, few steps, small batches): what CI runs to
keep the plumbing working where no GPU is.
"""
import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import models  # noqa: E402

BATCH = {"mlp": 64, "cnn": 64, "resnet18": 128}
STEPS = {"mlp": 2000, "cnn": 1000, "resnet18": 200}
CONFIGS = {"nccl-w1": ("nccl", 1), "gloo-w2": ("gloo", 2)}
SIDES = ("pytorch", "libddp", "ddp-trainer")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GpuSampler:
    """nvidia-smi every 200 ms while a run lasts: mean utilization, peak memory used."""

    def __init__(self):
        self.util, self.mem, self.proc = [], [], None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                u, m = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.util.append(u)
            self.mem.append(m)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
        return {"gpu_util_pct": round(statistics.mean(self.util), 1) if self.util else None,
                "gpu_mem_peak_mib": max(self.mem) if self.mem else None}


def run_ranks(argv_of_rank, world, env_extra, cwd, timeout):
    """Starts `world` ranks with torchrun's environment; returns their stdouts."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env_extra)
        env.pop("DDP_EVENTS_FD", None)
        procs.append(subprocess.Popen(argv_of_rank(rank), env=env, cwd=cwd, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs, failed = [], []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            failed.append(f"rank {rank}: timed out after {timeout} s\n{err[-1500:]}")
            continue
        if p.returncode != 0:
            failed.append(f"rank {rank}: exit {p.returncode}\n{err[-1500:]}")
        outs.append(out)
    if failed:
        raise RuntimeError("\n".join(failed))
    return outs


def loop_rate(outs):
    """pytorch and libddp: each rank's {"samples", "train_s"} line -> samples/s, all ranks."""
    total = 0.0
    for out in outs:
        d = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
        total += d["samples"] / d["train_s"]
    return total


def trainer_rate(outs, warmup_events):
    """ddp-trainer: the step events' windows after the first `warmup_events` of each rank
    (per-rank samples/s over equal windows: their harmonic mean), summed over ranks."""
    total = 0.0
    for out in outs:
        rates = [json.loads(l)["samples_per_s"] for l in out.splitlines()
                 if l.startswith("{") and '"type":"step"' in l]
        rates = rates[warmup_events:]
        if not rates:
            raise RuntimeError("ddp-trainer printed no step events past the warm-up")
        total += len(rates) / sum(1.0 / r for r in rates)
    return total


def trainer_job(path, model, model_pt, backend, device, batch, steps, warmup, world):
    samples = (warmup + steps + 2) * batch * world
    with open(path, "w") as f:
        f.write(f"""name: gpu-bench-{model}
model: {{torchscript: {{path: {model_pt}}}}}
data: {{synthetic: {{samples: {samples}, features: {models.FEATURES[model]}, classes: {models.CLASSES}}}}}
backend: {backend}
train:
  epochs: 1
  batch_size: {batch}
  max_steps: {warmup + steps}
  threads: 1
  device: {device}
  intra_node_comm: gloo
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
metrics: {{every_steps: {warmup}}}
""")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build dir with bin/ddp-trainer, bin/ddp-bench-gpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=sys.executable, help="the Python with torch (PyTorch's side)")
    ap.add_argument("--models", default="mlp,cnn,resnet18")
    ap.add_argument("--configs", default="nccl-w1,gloo-w2")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--ld-library-path", default="",
                    help="LD_LIBRARY_PATH entries for ddp-trainer and the libddp program (a "
                         "prebuilt engine: torch's lib, the carried packages', libddp.so's)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, Gloo, a few steps")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ddp-gpu-bench-")
    try:
        return bench(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench(a, tmp):
    names = a.models.split(",")
    subprocess.run([a.python, os.path.join(HERE, "models.py"), "--out", tmp, "--models",
                    ",".join(names)], check=True)
    warmup = 2 if a.dry_run else a.warmup
    device = "cpu" if a.dry_run else "cuda"
    trainer = os.path.join(a.build, "bin", "ddp-trainer")
    program = os.path.join(a.build, "bin", "ddp-bench-gpu")
    engine_env = {}
    if a.ld_library_path:  # Not PyTorch's side: its Python loads the machine's own libraries.
        engine_env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (a.ld_library_path, os.environ.get("LD_LIBRARY_PATH", "")) if p)
    rows = []
    turn = 0
    for model in names:
        batch = 4 if a.dry_run else BATCH[model]
        steps = 2 * warmup if a.dry_run else STEPS[model]
        pt = os.path.join(tmp, f"{model}.pt")
        for config in a.configs.split(","):
            backend, world = CONFIGS[config]
            if a.dry_run:
                backend = "gloo"
            job = os.path.join(tmp, f"{model}-{config}.yaml")
            trainer_job(job, model, pt, backend, device, batch, steps, warmup, world)
            common = ["--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
                      "--backend", backend, "--device", device]
            argv = {
                "pytorch": lambda r: [a.python, os.path.join(HERE, "pytorch_ddp.py"),
                                      "--model", model] + common,
                "libddp": lambda r: [program, "--model", pt, "--features",
                                     str(models.FEATURES[model]), "--classes",
                                     str(models.CLASSES)] + common,
                "ddp-trainer": lambda r: [trainer, "--spec", job],
            }
            rates = {s: [] for s in SIDES}
            gpu = {s: [] for s in SIDES}
            for rep in range(a.repeats):
                order = SIDES[turn % 3:] + SIDES[:turn % 3]
                turn += 1
                for side in order:
                    sampler = GpuSampler()
                    try:
                        outs = run_ranks(argv[side], world,
                                         {} if side == "pytorch" else engine_env, tmp,
                                         timeout=120)
                    finally:
                        g = sampler.stop()
                    rate = trainer_rate(outs, 1) if side == "ddp-trainer" else loop_rate(outs)
                    rates[side].append(rate)
                    gpu[side].append(g)
                    print(f"{model} {config} {side}: {rate:,.0f} samples/s "
                          f"(util {g['gpu_util_pct']} %, peak {g['gpu_mem_peak_mib']} MiB)",
                          flush=True)
            row = {"model": model, "config": config, "backend": backend, "world": world,
                   "device": device, "batch_per_rank": batch, "timed_steps": steps,
                   "warmup_steps": warmup}
            for side in SIDES:
                row[side] = {"samples_per_s": round(statistics.median(rates[side]), 1),
                             "runs": [round(r, 1) for r in rates[side]],
                             "gpu": gpu[side]}
            for side in ("libddp", "ddp-trainer"):
                row[f"{side}_over_pytorch"] = round(
                    statistics.median(rates[side]) / statistics.median(rates["pytorch"]), 3)
            rows.append(row)
    torch_info = subprocess.run(
        [a.python, "-c", "import torch; print(torch.__version__); "
         "print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"],
        capture_output=True, text=True).stdout.split("\n")
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "torch": torch_info[0], "gpu": torch_info[1] if len(torch_info) > 1 else "",
              "dry_run": a.dry_run, "repeats": a.repeats, "rows": rows}
    with open(os.path.join(a.out, "gpu_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    lines = [f"GPU: {result['gpu']}; torch {result['torch']}; medians of {a.repeats}" +
             ("; DRY RUN: every configuration on Gloo and the CPU, a few steps: the figures "
              "say nothing" if a.dry_run else ""),
             "", "| model | config | PyTorch DDP | libddp | ddp-trainer | libddp / PyTorch | "
             "ddp-trainer / PyTorch | util % (pt / lib / trainer) | peak MiB (pt / lib / trainer) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        util = " / ".join(str(r[s]["gpu"][0]["gpu_util_pct"]) for s in SIDES)
        mem = " / ".join(str(r[s]["gpu"][0]["gpu_mem_peak_mib"]) for s in SIDES)
        lines.append(f"| {r['model']} | {r['config']} | {r['pytorch']['samples_per_s']:,.0f} | "
                     f"{r['libddp']['samples_per_s']:,.0f} | {r['ddp-trainer']['samples_per_s']:,.0f} | "
                     f"{r['libddp_over_pytorch']:.2f}x | {r['ddp-trainer_over_pytorch']:.2f}x | "
                     f"{util} | {mem} |")
    with open(os.path.join(a.out, "gpu_bench.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
