"""The GPU bench: ddp-trainer and libddp programs against PyTorch's DDP (eager and compiled) and llm.c.

    python3 bench/gpu/bench.py --build BUILD_DIR --out OUT_DIR [--parts gpt,models]
        [--models mlp,cnn,resnet18] [--configs nccl-w1] [--repeats 1] [--gpt-batch 0]
        [--deadline 300] [--side-timeout 240] [--peak-tflops 0] [--llmc-bin PATH]
        [--dry-run]

Two parts, each side one process group after the other, GPU utilization and memory
sampled by nvidia-smi every 200 ms while it runs (its mean utilization: the GPU's busy
time; its whole-GPU peak memory, CUDA contexts included):

gpt: GPT-2 (124M: 12 layers, 12 heads, dim 768, seq_len 1024, vocab 50304, tied head,
  dropout 0), bf16 autocast, AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1
  on the matrices and embeddings), fused where the side has it, linear warm-up then
  cosine, gradients clipped at 1.0, --gpt-batch windows a step (0: 32 on a GPU of 60 GiB
  or more, else 16), on byte-level token files made here (bench/gpu/tokens.py), NCCL at
  world 1. Sides:
    pytorch          tests/reference/nanogpt.py's GPT in DDP, eager (bench/gpu/gpt_pytorch.py)
    pytorch-compile  the same, torch.compile(model) before DDP (nanoGPT's train.py)
    ddp-trainer      the built-in trainer, model.gpt and data.tokens (job.yaml), cuda_graph auto
    libddp           ddp-gpt-example (examples/gpt/), libddp's public API, --cuda-graph auto
    llm.c            karpathy/llm.c's train_gpt2cu -e d12 (random init), the anchor
  Tokens/s over the steps after --gpt-warmup (llm.c: the median of its per-step figures
  after as many steps), and MFU = (6 N + 12 layers dim seq_len) FLOPs per token x tokens/s
  / the card's dense bf16 peak (989 TFLOPS for H100 SXM and H200; --peak-tflops
  overrides; N counts every parameter, the tied head once).

models: bench/gpu/models.py's MLP, CNN and ResNet-18 on synthetic rows, SGD, each
  configuration of --configs (nccl-w1: NCCL at world 1; gloo-w2: two ranks on the one GPU
  over Gloo's CUDA path). Sides:
    pytorch            torch.nn.parallel.DistributedDataParallel, eager (bench/gpu/pytorch_ddp.py)
    pytorch-compile    the same, torch.compile(mode="reduce-overhead") before DDP
    libddp             ddp-bench-gpu (libddp's public API), --cuda-graph off
    libddp-graph       the same, --cuda-graph on (the whole step in one CUDA graph)
    ddp-trainer        the built-in trainer, model.torchscript, train.cuda_graph: false
    ddp-trainer-graph  the same, train.cuda_graph: true
  Samples/s over the steps after --warmup, summed over ranks; --repeats runs of each side,
  the order rotating, medians reported.

A side that fails, times out (--side-timeout, or the --deadline of the whole bench) or is
not built shows as such with the reason; the JSON and the tables are rewritten after
every side, so they hold whatever finished. Results: OUT_DIR/gpu_bench.json and
OUT_DIR/gpu_bench.md. Exits 1 if a side failed or timed out (not for skipped or not-built
sides).

--dry-run does all it can on the CPU (Gloo, tiny sizes, a few steps; torch.compile with
the aot_eager backend: inductor's C++ compile takes minutes on a small CPU), skipping with
the reason what needs a GPU (CUDA graphs, llm.c): what CI runs to keep the plumbing
working where no GPU is.
"""
import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
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
import tokens as token_files  # noqa: E402

BATCH = {"mlp": 64, "cnn": 64, "resnet18": 128}
STEPS = {"mlp": 2000, "cnn": 1000, "resnet18": 200}
CONFIGS = {"nccl-w1": ("nccl", 1), "gloo-w2": ("gloo", 2)}
SIDES = ("pytorch", "libddp", "ddp-trainer")  # parity.py's and the old table's three
MODEL_SIDES = ("pytorch", "pytorch-compile", "libddp", "libddp-graph", "ddp-trainer",
               "ddp-trainer-graph")
GPT_SIDES = ("pytorch", "pytorch-compile", "ddp-trainer", "libddp", "llm.c")
GPT_124M = {"layers": 12, "heads": 12, "dim": 768, "seq_len": 1024, "vocab": 50304}
GPT_TINY = {"layers": 2, "heads": 2, "dim": 64, "seq_len": 64, "vocab": 512}
# llm.c's GPT-2 descriptors (train_gpt2.cu, gpt2_set_hyperparameters): depth -> dim, heads.
LLMC_DEPTHS = {6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
LABELS = {
    "pytorch": "PyTorch DDP, eager",
    "pytorch-compile": "PyTorch DDP, torch.compile",
    "libddp": "libddp",
    "libddp-graph": "libddp, CUDA graph",
    "ddp-trainer": "ddp-trainer",
    "ddp-trainer-graph": "ddp-trainer, CUDA graph",
    "llm.c": "llm.c (train_gpt2cu)",
}


def peak_flops_for(name):
    """The dense bf16 peak of a GPU by its name (NVIDIA's datasheets), or None."""
    n = (name or "").upper()
    if "H100" in n:
        if "PCIE" in n:
            return 756e12
        if "NVL" in n:
            return 835e12
        return 989e12  # SXM5 ("NVIDIA H100 80GB HBM3")
    if "H200" in n or "GH200" in n:
        return 989e12
    if "A100" in n:
        return 312e12
    return None


def gpt_params(c):
    """nanoGPT's parameter count, the tied head once: wte, wpe, the blocks, ln_f."""
    d = c["dim"]
    return c["vocab"] * d + c["seq_len"] * d + c["layers"] * (12 * d * d + 13 * d) + 2 * d


def gpt_flops_per_token(c):
    """The design's MFU numerator (tests/reference/nanogpt.py's flops_per_token)."""
    return 6 * gpt_params(c) + 12 * c["layers"] * c["dim"] * c["seq_len"]


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


class SideTimeout(RuntimeError):
    pass


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the rank and what it started (compile workers)
    except (ProcessLookupError, PermissionError):
        pass


def run_ranks(argv_of_rank, world, env_extra, cwd, timeout, errs=None):
    """Starts `world` ranks with torchrun's environment; returns their stdouts (and
    appends their stderrs to `errs` when given). Raises SideTimeout past `timeout`
    seconds (every rank killed) and RuntimeError when a rank fails."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env_extra)
        env.pop("DDP_EVENTS_FD", None)
        procs.append(subprocess.Popen(argv_of_rank(rank), env=env, cwd=cwd, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True))
    outs, failed, timed_out = [], [], False
    deadline = time.monotonic() + timeout
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                _kill_group(q)
            out, err = p.communicate()
            failed.append(f"rank {rank}: timed out after {timeout:.0f} s\n{err[-1500:]}")
            outs.append(out)
            if errs is not None:
                errs.append(err)
            continue
        _kill_group(p)  # leftovers of an exited rank
        if p.returncode != 0:
            failed.append(f"rank {rank}: exit {p.returncode}\n{err[-1500:]}")
        outs.append(out)
        if errs is not None:
            errs.append(err)
    if failed:
        raise (SideTimeout if timed_out else RuntimeError)("\n".join(failed))
    return outs


def json_lines(out):
    lines = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    return lines


def last_json(out, who):
    lines = json_lines(out)
    if not lines:
        raise RuntimeError(f"{who} printed no JSON line")
    return lines[-1]


def loop_rate(outs):
    """pytorch and libddp: each rank's {"samples", "train_s"} line -> samples/s, all ranks."""
    total = 0.0
    for out in outs:
        d = last_json(out, "the program")
        total += d["samples"] / d["train_s"]
    return total


def step_events(out):
    return [e for e in json_lines(out) if e.get("type") == "step"]


def trainer_rate(outs, warmup_events):
    """ddp-trainer: the step events' windows after the first `warmup_events` of each rank
    (per-rank samples/s over equal windows: their harmonic mean), summed over ranks."""
    total = 0.0
    for out in outs:
        rates = [e["samples_per_s"] for e in step_events(out)][warmup_events:]
        if not rates:
            raise RuntimeError("ddp-trainer printed no step events past the warm-up")
        total += len(rates) / sum(1.0 / r for r in rates)
    return total


def trainer_job(path, model, model_pt, backend, device, batch, steps, warmup, world,
                cuda_graph=None):
    samples = (warmup + steps + 2) * batch * world
    graph = "" if cuda_graph is None else f"\n  cuda_graph: {'true' if cuda_graph else 'false'}"
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
  intra_node_comm: gloo{graph}
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
metrics: {{every_steps: {warmup}}}
""")


def profile_lines(g):
    """Where the GPT step goes, for the sides that were profiled (--gpt-profile)."""
    profiled = [(side, r["profile"]) for side, r in g["sides"].items() if r.get("profile")]
    if not profiled:
        return []
    lines = ["", "Where the GPT step goes (torch.profiler over the steps after the timed ones; "
             "ms a step; GPU busy: the union of the device's kernels, memcpys and memsets "
             "over the wall time):", ""]
    kinds = []
    for _, p in profiled:
        kinds += [k for k in p.get("kinds_ms_per_step", {}) if k not in kinds]
    lines += ["| side | steps | wall | kernels | GPU busy % |" + "".join(f" {k} |" for k in kinds),
              "|---|---|---|---|---|" + "---|" * len(kinds)]
    for side, p in profiled:
        if "error" in p:
            lines.append(f"| {LABELS[side]} | profile failed: {p['error'][:300]} |")
            continue
        k = p.get("kinds_ms_per_step", {})
        lines.append(f"| {LABELS[side]} | {p['steps']} | {p['wall_ms_per_step']} | "
                     f"{p.get('kernel_ms_per_step', '-')} | {fmt(p.get('busy_pct'), 1)} |"
                     + "".join(f" {k.get(x, '-')} |" for x in kinds))
    for side, p in profiled:
        top = p.get("top_kernels") or p.get("top_cpu_ops") or []
        if top:
            what = "kernels" if p.get("top_kernels") else "CPU operators (self time)"
            lines += ["", f"{LABELS[side]}: the {len(top)} {what} that took the longest "
                      "(ms a step, calls a step): " + "; ".join(
                          f"`{n}` {t} ({c})" for n, t, c in top)]
    return lines


def gpt_job(path, c, tokens, backend, device, batch, steps, warmup, lr_warmup):
    """ddp-trainer's GPT job: what bench/gpu/gpt_pytorch.py does, in job.yaml."""
    with open(path, "w") as f:
        f.write(f"""name: gpu-bench-gpt
model:
  gpt: {{layers: {c['layers']}, heads: {c['heads']}, dim: {c['dim']}, seq_len: {c['seq_len']}, vocab: {c['vocab']}, dropout: 0, tie_weights: true}}
data:
  tokens: {{path: {tokens}, dtype: uint16}}
backend: {backend}
train:
  epochs: 1
  batch_size: {batch}
  drop_last: true
  max_steps: {warmup + steps}
  threads: 1
  device: {device}
  intra_node_comm: gloo
  precision: bf16
  clip_grad_norm: 1.0
  cuda_graph: auto
  optimizer: {{name: adamw, lr: 6.0e-4, weight_decay: 0.1, betas: [0.9, 0.95], eps: 1.0e-8, fused: auto, weight_decay_params: matrices}}
  lr_schedule: {{name: cosine, warmup: {lr_warmup}, warmup_start_factor: 0.1, eta_min: 0}}
  loss: cross_entropy
metrics: {{every_steps: {warmup}}}
""")


LLMC_STEP = re.compile(r"^step\s+(\d+)/(\d+) \| loss (\S+) .*?\| ([\d.]+) ms \|")


def parse_llmc(out, batch, seq_len, skip):
    """train_gpt2cu's per-step lines -> (median tokens/s after `skip` steps, the mean over
    them, losses, device memory used)."""
    steps = []
    for line in out.splitlines():
        m = LLMC_STEP.match(line.strip())
        if m:
            steps.append((int(m.group(1)), float(m.group(3)), float(m.group(4))))
    if not steps:
        raise RuntimeError("llm.c printed no step lines")
    timed = [ms for s, _, ms in steps if s > skip]
    if not timed:
        raise RuntimeError(f"llm.c printed {len(steps)} steps, none past the first {skip}")
    rates = [batch * seq_len * 1000.0 / ms for ms in timed]
    mem = re.search(r"device memory usage: (\d+) MiB / (\d+) MiB", out)
    return {"tokens_per_s": statistics.median(rates),
            "tokens_per_s_mean": batch * seq_len * len(timed) * 1000.0 / sum(timed),
            "timed_steps": len(timed),
            "losses": [l for _, l, _ in steps],
            "device_mem_used_mib": int(mem.group(1)) if mem else None}


def cublas_dirs(python):
    """Where train_gpt2cu finds libcublasLt.so.13: the CUDA toolkit's lib64, torch's
    nvidia wheels (nvidia/cu13/lib)."""
    dirs = [d for d in ("/usr/local/cuda/lib64",) if os.path.isdir(d)]
    site = subprocess.run([python, "-c", "import os, torch; "
                           "print(os.path.dirname(os.path.dirname(torch.__file__)))"],
                          capture_output=True, text=True).stdout.strip()
    if site:
        dirs += sorted({os.path.dirname(p) for p in
                        glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcublas*.so*"))})
    return dirs


def llmc_tokens_check(src, path, batch, seq_len, steps, vocab, tmp):
    """llm.c's own DataLoader (its llmc/dataloader.h, compiled with bench/gpu/
    llmc_tokens_check.c) reading the token file made for it; raises where it refuses it.
    Says why not where the source or a C compiler is missing."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not src or not os.path.isfile(os.path.join(src, "llmc", "dataloader.h")) or not cc:
        return ("its DataLoader not run on the token file: "
                + ("no C compiler" if not cc else f"no llm.c source at {src}"))
    exe = os.path.join(tmp, "llmc_tokens_check")
    if not os.path.exists(exe):
        subprocess.run([cc, "-O1", "-I", src, "-o", exe,
                        os.path.join(HERE, "llmc_tokens_check.c"), "-lm"],
                       check=True, capture_output=True, text=True)
    r = subprocess.run([exe, path, str(batch), str(seq_len), str(steps), str(vocab)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"llm.c's DataLoader refuses {path}: {(r.stdout + r.stderr)[-600:]}")
    return r.stdout.strip()


class Bench:
    def __init__(self, a, tmp):
        self.a, self.tmp = a, tmp
        self.start = time.monotonic()
        self.failures = []
        self.result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                       "dry_run": a.dry_run, "repeats": a.repeats, "deadline_s": a.deadline,
                       "side_timeout_s": a.side_timeout, "gpt": None, "rows": []}
        self.engine_env = {}
        if a.ld_library_path:  # Not PyTorch's side: its Python loads the machine's own libraries.
            self.engine_env["LD_LIBRARY_PATH"] = ":".join(
                p for p in (a.ld_library_path, os.environ.get("LD_LIBRARY_PATH", "")) if p)
        self.device = "cpu" if a.dry_run else "cuda"
        self.compile_backend = "aot_eager" if a.dry_run else "inductor"

    # -- bookkeeping --------------------------------------------------------------------
    def remaining(self):
        if not self.a.deadline:
            return float("inf")
        return self.a.deadline - (time.monotonic() - self.start)

    def side(self, label, fn, side_timeout=None):
        """Runs fn(timeout) -> dict of figures; returns the side's record with its status."""
        left = self.remaining()
        if left < 5:
            rec = {"status": "skipped",
                   "reason": f"the bench's deadline (--deadline {self.a.deadline:g} s) was reached"}
            print(f"{label}: skipped ({rec['reason']})", flush=True)
            return rec
        timeout = min(side_timeout or self.a.side_timeout, left)
        by_deadline = timeout < (side_timeout or self.a.side_timeout)
        sampler = GpuSampler()
        t0 = time.monotonic()
        try:
            rec = fn(timeout)
            rec.setdefault("status", "ok")
        except SideTimeout as e:
            why = (f"stopped at the bench's deadline (--deadline {self.a.deadline:g} s)"
                   if by_deadline else f"over --side-timeout {timeout:.0f} s")
            rec = {"status": "timed out", "reason": f"{why}: {str(e)[-600:]}"}
        except Exception as e:  # noqa: BLE001 - a side's failure is a result, not the end
            rec = {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[-1200:]}"}
        finally:
            g = sampler.stop()
        rec["wall_s"] = round(time.monotonic() - t0, 1)
        rec["gpu"] = g
        if rec["status"] in ("failed", "timed out"):
            self.failures.append(f"{label}: {rec['status']}: {rec['reason'][:300]}")
        shown = {k: rec[k] for k in ("tokens_per_s", "samples_per_s", "mfu") if k in rec}
        print(f"{label}: {rec['status']} {json.dumps(shown)} ({rec['wall_s']} s; util "
              f"{g['gpu_util_pct']} %, peak {g['gpu_mem_peak_mib']} MiB)"
              + (f"\n  {rec['reason'][:2000]}" if rec.get("reason") else ""), flush=True)
        return rec

    def write(self):
        self.result["bench_wall_s"] = round(time.monotonic() - self.start, 1)
        self.result["failures"] = self.failures
        add_ratios(self.result)
        with open(os.path.join(self.a.out, "gpu_bench.json"), "w") as f:
            json.dump(self.result, f, indent=1)
            f.write("\n")
        with open(os.path.join(self.a.out, "gpu_bench.md"), "w") as f:
            f.write(render_md(self.result) + "\n")

    # -- the machine --------------------------------------------------------------------
    def probe(self):
        info = subprocess.run(
            [self.a.python, "-c",
             "import json, torch; c = torch.cuda.is_available(); "
             "p = torch.cuda.get_device_properties(0) if c else None; "
             "print(json.dumps({'torch': torch.__version__, 'gpu': p.name if c else 'no GPU', "
             "'gpu_mem_mib': p.total_memory // 2**20 if c else None}))"],
            capture_output=True, text=True)
        try:
            d = json.loads(info.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SystemExit(f"bench.py: {self.a.python} could not import torch:\n{info.stderr}")
        self.result.update(torch=d["torch"], gpu=d["gpu"], gpu_mem_mib=d["gpu_mem_mib"])
        peak = self.a.peak_tflops * 1e12 if self.a.peak_tflops else peak_flops_for(d["gpu"])
        self.result["peak_flops"] = peak
        self.result["peak_flops_from"] = ("--peak-tflops" if self.a.peak_tflops else
                                          "the GPU's name" if peak else "unknown: no MFU")

    # -- GPT ----------------------------------------------------------------------------
    def gpt(self):
        a = self.a
        c = dict(GPT_TINY if a.dry_run else GPT_124M)
        for k in c:
            v = getattr(a, f"gpt_{k}")
            if v:
                c[k] = v
        batch = a.gpt_batch or (4 if a.dry_run else
                                32 if (self.result.get("gpu_mem_mib") or 0) >= 60 * 1024 else 16)
        warmup = 2 if a.dry_run else a.gpt_warmup
        steps = 3 if a.dry_run else a.gpt_steps
        lr_warmup = min(a.gpt_lr_warmup, warmup + steps - 1)
        backend, world = ("gloo", 1) if a.dry_run else ("nccl", 1)
        flops = gpt_flops_per_token(c)
        peak = self.result.get("peak_flops")
        windows = (warmup + steps) * batch * world
        tok_dir = os.path.join(self.tmp, "gpt-tokens")
        os.makedirs(tok_dir, exist_ok=True)
        train = os.path.join(tok_dir, "train.bin")
        token_files.write_bin(train, windows * c["seq_len"] + 1)
        llmc_train = os.path.join(tok_dir, "train_llmc.bin")
        token_files.llmc_from_bin(train, llmc_train)
        token_files.check_llmc(llmc_train)
        g = {"config": c, "params": gpt_params(c), "flops_per_token": flops, "batch": batch,
             "warmup_steps": warmup, "timed_steps": steps, "lr_warmup": lr_warmup,
             "backend": backend, "world": world, "device": self.device,
             "tokens_in_file": windows * c["seq_len"] + 1, "sides": {}}
        self.result["gpt"] = g
        common = ["--layers", str(c["layers"]), "--heads", str(c["heads"]), "--dim",
                  str(c["dim"]), "--seq-len", str(c["seq_len"]), "--vocab", str(c["vocab"]),
                  "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
                  "--device", self.device, "--backend", backend]

        def figures(tokens_per_s, rec):
            rec["tokens_per_s"] = round(tokens_per_s, 1)
            if peak:
                rec["mfu"] = round(flops * tokens_per_s / peak, 4)
            return rec

        def pytorch(compiled):
            def fn(timeout):
                argv = [a.python, os.path.join(HERE, "gpt_pytorch.py"), "--train", train,
                        "--lr-warmup", str(lr_warmup)] + common
                if a.dry_run:
                    argv += ["--threads", "1"]
                if compiled:
                    argv += ["--compile", "--compile-backend", self.compile_backend]
                profile = a.gpt_profile or (1 if a.dry_run else 0)
                if profile:
                    argv += ["--profile-steps", str(profile)]
                outs = run_ranks(lambda r: argv, world, {}, self.tmp, timeout)
                ds = [last_json(o, "gpt_pytorch.py") for o in outs]
                if ds[0]["params"] != g["params"]:
                    raise RuntimeError(f"the model has {ds[0]['params']} parameters, "
                                       f"bench.py counts {g['params']}")
                rec = {"losses": ds[0]["losses"], "peak_mem_mib": ds[0]["peak_mem_mib"],
                       "first_step_s": ds[0]["first_step_s"], "warmup_s": ds[0]["warmup_s"],
                       "fused_adamw": ds[0]["fused_adamw"]}
                if "profile" in ds[0]:
                    rec["profile"] = ds[0]["profile"]
                if compiled:
                    rec["compile"] = (f"torch.compile(model), backend {self.compile_backend}"
                                      + (" (the CPU: inductor's C++ compile takes minutes)"
                                         if a.dry_run else "") +
                                      f"; the first step took {ds[0]['first_step_s']} s")
                return figures(sum(d["tokens"] / d["train_s"] for d in ds), rec)
            return fn

        def trainer(timeout):
            job = os.path.join(self.tmp, "gpt.yaml")
            gpt_job(job, c, train, backend, self.device, batch, steps, warmup, lr_warmup)
            exe = os.path.join(a.build, "bin", "ddp-trainer")
            if not os.path.exists(exe):
                return {"status": "not built", "reason": f"no {exe}"}
            outs = run_ranks(lambda r: [exe, "--spec", job], world, self.engine_env,
                             self.tmp, timeout)
            events = step_events(outs[0])
            mems = [e["gpu_memory_peak_mib"] for e in events
                    if e.get("gpu_memory_peak_mib") is not None]
            rec = {"losses": [e["loss"] for e in events], "loss_every_steps": warmup,
                   "peak_mem_mib": max(mems) if mems else None}
            starts = [e for e in json_lines(outs[0]) if e.get("type") == "start"]
            if starts and "cuda_graph" in starts[0]:
                rec["cuda_graph"] = starts[0]["cuda_graph"]
            return figures(trainer_rate(outs, 1) * c["seq_len"], rec)

        def example(timeout):
            exe = os.path.join(a.build, "bin", "ddp-gpt-example")
            if not os.path.exists(exe):
                return {"status": "not built",
                        "reason": f"no {exe} (examples/gpt/'s program, beside ddp-trainer)"}
            argv = [exe, "--train", train, "--dtype", "uint16", "--lr", "6e-4",
                    "--lr-warmup", str(lr_warmup), "--precision", "bf16",
                    "--cuda-graph", "auto"] + common
            outs = run_ranks(lambda r: argv, world, self.engine_env, self.tmp, timeout)
            ds = [last_json(o, "ddp-gpt-example") for o in outs]
            rec = {"losses": ds[0].get("losses"), "cuda_graph": ds[0].get("cuda_graph"),
                   "peak_mem_mib": ds[0].get("peak_mem_mib")}
            return figures(sum(d["tokens"] / d["train_s"] for d in ds), rec)

        def llmc(timeout):
            checked = llmc_tokens_check(a.llmc_src, llmc_train, batch, c["seq_len"],
                                        warmup + steps, c["vocab"], self.tmp)
            if a.dry_run:
                return {"status": "skipped", "reason": "llm.c trains on a GPU only (CUDA "
                        f"kernels); {checked}"}
            exe = a.llmc_bin
            if not exe or not os.path.exists(exe):
                return {"status": "not built", "reason": "no llm.c binary"
                        + (f" at {exe}" if exe else "") + " (bench/gpu/pack.sh builds it into "
                        ".gpu-carry/llm.c, run.sh there where it does not load)"}
            shape = LLMC_DEPTHS.get(c["layers"])
            if shape != (c["dim"], c["heads"]) or c["vocab"] != 50304 or c["seq_len"] > 1024:
                return {"status": "skipped", "reason": "llm.c's descriptors (-e dL) have no "
                        f"GPT of {c['layers']} layers, dim {c['dim']}, {c['heads']} heads, "
                        f"vocab {c['vocab']}, seq_len {c['seq_len']}"}
            argv = [exe, "-i", llmc_train, "-j", llmc_train, "-e", f"d{c['layers']}",
                    "-b", str(batch), "-t", str(c["seq_len"]), "-x", str(warmup + steps),
                    "-l", "6e-4", "-u", str(lr_warmup), "-q", "0.0", "-k", "cosine",
                    "-c", "0.1", "-v", "1000000", "-m", "1", "-s", "0", "-h", "0",
                    "-n", "0", "-r", str(a.llmc_recompute)]
            env = dict(self.engine_env)
            dirs = cublas_dirs(a.python)
            env["LD_LIBRARY_PATH"] = ":".join(dirs + [os.environ.get("LD_LIBRARY_PATH", "")])
            outs = run_ranks(lambda r: argv, 1, env, self.tmp, timeout)
            p = parse_llmc(outs[0], batch, c["seq_len"], warmup)
            rec = {"losses": p["losses"], "tokens_per_s_mean": round(p["tokens_per_s_mean"], 1),
                   "token_file": checked,
                   "device_mem_used_mib": p["device_mem_used_mib"],
                   "command": " ".join(os.path.basename(x) if x in (exe, llmc_train) else x
                                       for x in argv),
                   "settings": LLMC_SETTINGS.replace("RECOMPUTE", str(a.llmc_recompute))}
            return figures(p["tokens_per_s"], rec)

        fns = {"pytorch": pytorch(False), "pytorch-compile": pytorch(True),
               "ddp-trainer": trainer, "libddp": example, "llm.c": llmc}
        # The compile last: the longest, and the others' figures are in if the deadline cuts it.
        for side in ("llm.c", "ddp-trainer", "libddp", "pytorch", "pytorch-compile"):
            if side not in a.gpt_sides.split(","):
                continue
            g["sides"][side] = self.side(f"gpt {side}", fns[side],
                                         a.side_timeout * (2 if side == "pytorch-compile" else 1))
            self.write()
        self.write()

    def models(self):
        a = self.a
        names = a.models.split(",")
        subprocess.run([a.python, os.path.join(HERE, "models.py"), "--out", self.tmp,
                        "--models", ",".join(names)], check=True)
        warmup = 2 if a.dry_run else a.warmup
        sides = [s for s in MODEL_SIDES if s in a.model_sides.split(",")]
        model_steps = {k: int(v) for k, v in
                       (kv.split("=") for kv in a.model_steps.split(",") if kv)}
        cases = []
        for model in names:
            for config in a.configs.split(","):
                backend, world = CONFIGS[config]
                row = {"model": model, "config": config,
                       "backend": "gloo" if a.dry_run else backend, "world": world,
                       "device": self.device, "batch_per_rank": 4 if a.dry_run else BATCH[model],
                       "timed_steps": 2 * warmup if a.dry_run else model_steps.get(model, STEPS[model]),
                       "warmup_steps": warmup}
                self.result["rows"].append(row)
                cases.append(row)
        # Two passes: every row's other sides first, torch.compile's (the slowest, minutes
        # of compiling) after them, so that a deadline cuts those first.
        turn = 0
        for pass_sides in ([s for s in sides if s != "pytorch-compile"],
                           [s for s in sides if s == "pytorch-compile"]):
            for row in cases:
                runs = {s: [] for s in pass_sides}
                for rep in range(a.repeats):
                    n = max(1, len(pass_sides))
                    order = pass_sides[turn % n:] + pass_sides[:turn % n]
                    turn += 1
                    for side in order:
                        label = f"{row['model']} {row['config']} {side}"
                        why = self.model_skip_reason(row, side)
                        if why:
                            rec = {"status": "skipped", "reason": why}
                            print(f"{label}: skipped ({why})", flush=True)
                        else:
                            timeout = a.side_timeout * (2 if side == "pytorch-compile" else 1)
                            rec = self.side(label, self.model_side(row, side), timeout)
                        runs[side].append(rec)
                        row[side] = summarize(runs[side])
                        self.write()

    def model_skip_reason(self, row, side):
        if side.endswith("-graph"):
            if self.a.dry_run:
                return "whole-step CUDA graphs need a GPU"
            if row["backend"] != "nccl" or row["world"] != 1:
                return "whole-step CUDA graphs: NCCL at world 1 only in this bench"
        return None

    def model_side(self, row, side):
        """The function that runs one side of a model row."""
        a = self.a
        model, world = row["model"], row["world"]
        pt = os.path.join(self.tmp, f"{model}.pt")
        common = ["--batch", str(row["batch_per_rank"]), "--steps", str(row["timed_steps"]),
                  "--warmup", str(row["warmup_steps"]), "--backend", row["backend"],
                  "--device", self.device]

        def pytorch(timeout):
            errs = []
            # The loss read as often as ddp-trainer reports it (metrics.every_steps).
            argv = [a.python, os.path.join(HERE, "pytorch_ddp.py"), "--model", model,
                    "--loss-every", str(row["warmup_steps"])] + common
            if side == "pytorch-compile":
                argv += ["--compile", "reduce-overhead", "--compile-backend", self.compile_backend]
            outs = run_ranks(lambda r: argv, world, {}, self.tmp, timeout, errs)
            d = last_json(outs[0], "pytorch_ddp.py")
            rec = {"samples_per_s": round(loop_rate(outs), 1)}
            if side == "pytorch-compile":
                rec["compile"] = d.get("compile")
                rec["first_step_s"] = d.get("first_step_s")
                said = sorted({l.strip()[:200] for e in errs for l in e.splitlines()
                               if "skipping cudagraphs" in l or "Grad strides do not match" in l})
                if said:
                    rec["compile_said"] = said
            return rec

        def libddp(timeout):
            program = os.path.join(a.build, "bin", "ddp-bench-gpu")
            if not os.path.exists(program):
                return {"status": "not built", "reason": f"no {program}"}
            graph = "on" if side == "libddp-graph" else "off"
            argv = [program, "--model", pt, "--features", str(models.FEATURES[model]),
                    "--classes", str(models.CLASSES), "--cuda-graph", graph,
                    "--loss-every", str(row["warmup_steps"])] + common
            outs = run_ranks(lambda r: argv, world, self.engine_env, self.tmp, timeout)
            d = last_json(outs[0], "ddp-bench-gpu")
            rec = {"samples_per_s": round(loop_rate(outs), 1), "cuda_graph": d.get("cuda_graph")}
            if graph == "on" and not str(d.get("cuda_graph", "")).startswith("on"):
                raise RuntimeError("asked for --cuda-graph on, ddp-bench-gpu reports cuda_graph "
                                   + (repr(d["cuda_graph"]) if "cuda_graph" in d else
                                      "nothing (built before --cuda-graph?)"))
            return rec

        def trainer(timeout):
            exe = os.path.join(a.build, "bin", "ddp-trainer")
            if not os.path.exists(exe):
                return {"status": "not built", "reason": f"no {exe}"}
            job = os.path.join(self.tmp, f"{model}-{row['config']}-{side}.yaml")
            trainer_job(job, model, pt, row["backend"], self.device, row["batch_per_rank"],
                        row["timed_steps"], row["warmup_steps"], world,
                        cuda_graph=side == "ddp-trainer-graph")
            outs = run_ranks(lambda r: [exe, "--spec", job], world, self.engine_env, self.tmp,
                             timeout)
            return {"samples_per_s": round(trainer_rate(outs, 1), 1)}

        return pytorch if side.startswith("pytorch") else libddp if side.startswith("libddp") \
            else trainer


def add_ratios(res):
    """Each side's figure over PyTorch eager's and over PyTorch compiled's, where both exist."""
    tables = [(res["gpt"]["sides"], "tokens_per_s")] if res.get("gpt") else []
    tables += [(row, "samples_per_s") for row in res["rows"]]
    for sides, key in tables:
        for side, rec in list(sides.items()):
            if not isinstance(rec, dict) or "status" not in rec:
                continue
            for base in ("pytorch", "pytorch-compile"):
                k = f"over_{base.replace('-', '_')}"
                rec.pop(k, None)
                b = sides.get(base)
                if (side != base and rec.get("status") == "ok" and rec.get(key)
                        and isinstance(b, dict) and b.get("status") == "ok" and b.get(key)):
                    rec[k] = round(rec[key] / b[key], 3)


LLMC_SETTINGS = (
    "llm.c's flags: -e dL (random init, GPT-2's), same B and T, -x warm-up+timed steps, "
    "-l 6e-4 -u lr_warmup -q 0 -k cosine (its warm-up is lr*(step+1)/warmup, ours "
    "LinearLR from 0.1; cosine to 0 after), -c 0.1 (weight decay on 2-D tensors: "
    "matrices and embeddings, as ours), grad clip 1.0 (fixed in llm.c), -r RECOMPUTE "
    "(recompute in backward: 0 none, as ours; llm.c's default is 1, GELU recomputed), "
    "-v 1000000 -m 1 (one validation batch at the first and last step only, outside its "
    "step timer), -s 0 (no sampling), -h 0 (no HellaSwag), -n 0 and no -o (no checkpoints, "
    "no log). Defaults kept: bf16 parameters, activations and gradients with fp32 master "
    "weights and AdamW state (-w 1; ours: fp32 parameters and gradients under bf16 autocast), "
    "its own fused AdamW, GELU fusion off (-ge 0 by its default), TF32 on (-f 1), no cuDNN "
    "(USE_CUDNN=0: its own attention kernels, not flash attention; PyTorch's SDPA uses flash "
    "attention). Vocab 50257 padded to 50304: the same shapes. Its tokens/s: each step timed "
    "by CUDA events around the step (the gaps between steps not counted), the median after "
    "the warm-up steps.")


def summarize(recs):
    """One side's runs -> its record: the median of the ok runs' figures, the runs kept."""
    ok = [r for r in recs if r["status"] == "ok"]
    if not ok:
        return dict(recs[-1], runs=[r.get("samples_per_s") for r in recs])
    out = dict(ok[-1])
    out["samples_per_s"] = round(statistics.median(r["samples_per_s"] for r in ok), 1)
    out["runs"] = [r.get("samples_per_s") if r["status"] == "ok" else r["status"] for r in recs]
    return out


def fmt(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


def cell(rec, key, ratios=()):
    """A table cell: the figure (and ratios), or the status where there is none."""
    if not rec:
        return "-"
    if rec.get("status") != "ok":
        return rec.get("status", "?")
    s = fmt(rec.get(key))
    parts = [f"{rec[r]:.2f}x" for r in ratios if rec.get(r) is not None]
    return s + (f" ({' / '.join(parts)})" if parts else "")


def render_md(res):
    lines = [f"GPU: {res.get('gpu')}; torch {res.get('torch')}; {res['machine']}; "
             f"bench {res.get('bench_wall_s')} s" +
             ("; DRY RUN: the CPU, Gloo, tiny sizes, a few steps: the figures say nothing"
              if res["dry_run"] else "")]
    reasons = []
    g = res.get("gpt")
    if g:
        c = g["config"]
        peak = res.get("peak_flops")
        lines += ["", f"GPT ({c['layers']} layers, {c['heads']} heads, dim {c['dim']}, seq_len "
                  f"{c['seq_len']}, vocab {c['vocab']}; {g['params']:,} parameters), batch "
                  f"{g['batch']} x {c['seq_len']} tokens, bf16, {g['backend']} at world "
                  f"{g['world']}; {g['warmup_steps']} warm-up steps, then {g['timed_steps']} timed; "
                  f"{g['flops_per_token'] / 1e9:.3f} GFLOP a token; MFU against "
                  + (f"{peak / 1e12:g} TFLOPS ({res.get('peak_flops_from')})" if peak else
                     "no known peak (--peak-tflops)"), "",
                  "| side | tokens/s | MFU | / PyTorch eager | / PyTorch compile | peak MiB "
                  "(allocator / whole GPU) | GPU busy % | first loss -> last | notes |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for side in GPT_SIDES:
            r = g["sides"].get(side)
            if not r:
                continue
            ok = r.get("status") == "ok"
            losses = r.get("losses") or []
            notes = []
            if r.get("compile"):
                notes.append(r["compile"])
            if r.get("cuda_graph") is not None:
                notes.append(f"cuda_graph {r['cuda_graph']}")
            if side == "llm.c" and ok:
                notes.append(f"mean {fmt(r.get('tokens_per_s_mean'))} tokens/s; "
                             f"device memory used {fmt(r.get('device_mem_used_mib'))} MiB")
            if not ok:
                reasons.append(f"- gpt {side}: {r.get('status')}: {r.get('reason', '')[:600]}")
            mem = r.get("peak_mem_mib") or r.get("device_mem_used_mib")
            gpu = r.get("gpu") or {}
            mfu = f"{100 * r['mfu']:.1f}%" if ok and r.get("mfu") else "-"
            over = [f"{r[k]:.2f}x" if ok and r.get(k) else "-"
                    for k in ("over_pytorch", "over_pytorch_compile")]
            trend = f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "-"
            lines.append(f"| {LABELS[side]} | {cell(r, 'tokens_per_s')} | {mfu} | {over[0]} | "
                         f"{over[1]} | {fmt(mem)} / {fmt(gpu.get('gpu_mem_peak_mib'))} | "
                         f"{fmt(gpu.get('gpu_util_pct'), 1)} | {trend} | {'; '.join(notes)} |")
        if "llm.c" in g["sides"]:
            lines += ["", LLMC_SETTINGS.replace("RECOMPUTE", str(res.get("llmc_recompute", 0)))]
        lines += profile_lines(g)
    if res["rows"]:
        lines += ["", "MLP, CNN, ResNet-18: samples/s (over PyTorch eager / over PyTorch "
                  "compile reduce-overhead); GPU busy % in the order of the columns", "",
                  "| model | config | " + " | ".join(LABELS[s] for s in MODEL_SIDES) +
                  " | GPU busy % |", "|---|---|" + "---|" * (len(MODEL_SIDES) + 1)]
        for r in res["rows"]:
            cells, busy = [], []
            for side in MODEL_SIDES:
                rec = r.get(side)
                ratios = () if side == "pytorch" else (
                    ("over_pytorch",) if side == "pytorch-compile" else
                    ("over_pytorch", "over_pytorch_compile"))
                cells.append(cell(rec, "samples_per_s", ratios))
                busy.append(fmt((rec or {}).get("gpu", {}).get("gpu_util_pct"), 0)
                            if rec and rec.get("status") == "ok" else "-")
                if rec and rec.get("status") not in ("ok", None):
                    reasons.append(f"- {r['model']} {r['config']} {side}: {rec['status']}: "
                                   f"{rec.get('reason', '')[:600]}")
                if rec and rec.get("compile_said"):
                    reasons.append(f"- {r['model']} {r['config']} {side}: PyTorch said: "
                                   + "; ".join(rec["compile_said"]))
            lines.append(f"| {r['model']}, batch {r['batch_per_rank']} | {r['config']} "
                         f"({r['backend']}, world {r['world']}) | " + " | ".join(cells) +
                         f" | {' / '.join(busy)} |")
    if reasons:
        lines += ["", "Sides without a figure, and notes:", ""] + [
            x.replace("\n", " ") for x in reasons]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True,
                    help="the build dir with bin/ddp-trainer, bin/ddp-bench-gpu, bin/ddp-gpt-example")
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=sys.executable, help="the Python with torch (PyTorch's side)")
    ap.add_argument("--parts", default="gpt,models", help="gpt, models, or both")
    ap.add_argument("--models", default=None,
                    help="default mlp,cnn,resnet18 (the dry run: mlp)")
    ap.add_argument("--configs", default=None,
                    help="nccl-w1, gloo-w2 (default nccl-w1; the dry run: gloo-w2, on Gloo)")
    ap.add_argument("--model-sides", default=",".join(MODEL_SIDES))
    ap.add_argument("--gpt-sides", default=",".join(GPT_SIDES))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=20, help="the models' untimed steps")
    ap.add_argument("--model-steps", default="",
                    help="timed steps per model, e.g. mlp=500,cnn=300 (default: STEPS)")
    ap.add_argument("--gpt-batch", type=int, default=0,
                    help="windows a step (0: 32 on a GPU of 60 GiB or more, else 16)")
    ap.add_argument("--gpt-steps", type=int, default=30, help="GPT's timed steps")
    ap.add_argument("--gpt-warmup", type=int, default=10, help="GPT's untimed steps first")
    ap.add_argument("--gpt-lr-warmup", type=int, default=10, help="GPT's lr warm-up steps")
    ap.add_argument("--gpt-profile", type=int, default=0,
                    help="after the timed steps, this many more of each PyTorch GPT side under "
                         "torch.profiler: where the step goes (the dry run profiles 1)")
    for k in GPT_124M:
        ap.add_argument(f"--gpt-{k.replace('_', '-')}", type=int, default=0,
                        help=f"GPT's {k} (0: GPT-2 124M's {GPT_124M[k]})")
    ap.add_argument("--peak-tflops", type=float, default=0,
                    help="the GPU's dense bf16 peak for MFU (0: by its name)")
    ap.add_argument("--llmc-bin", default=os.path.join(ROOT, ".gpu-carry", "llm.c", "train_gpt2cu"))
    ap.add_argument("--llmc-src", default=os.path.join(ROOT, ".gpu-carry", "llm.c", "src"),
                    help="llm.c's source: its DataLoader checks the token file made for it")
    ap.add_argument("--llmc-recompute", type=int, default=0,
                    help="llm.c's -r (0: recompute nothing, as the other sides)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds for the whole bench; sides past it are skipped or stopped "
                         "(default 300 on a GPU, none in the dry run; 0: none)")
    ap.add_argument("--side-timeout", type=float, default=None,
                    help="seconds a side may take (default 240 on a GPU, 180 in the dry run; "
                         "twice that for torch.compile's sides)")
    ap.add_argument("--ld-library-path", default="",
                    help="LD_LIBRARY_PATH entries for ddp-trainer and the libddp programs (a "
                         "prebuilt engine: torch's lib, the carried packages', libddp.so's)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, Gloo, a few steps")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.out = os.path.abspath(a.out)
    if os.sep in a.python:
        a.python = os.path.abspath(a.python)
    if a.llmc_bin:
        a.llmc_bin = os.path.abspath(a.llmc_bin)
    if a.llmc_src:
        a.llmc_src = os.path.abspath(a.llmc_src)
    a.models = a.models or ("mlp" if a.dry_run else "mlp,cnn,resnet18")
    a.configs = a.configs or ("gloo-w2" if a.dry_run else "nccl-w1")
    if a.deadline is None:
        a.deadline = 0 if a.dry_run else 300
    if a.side_timeout is None:
        a.side_timeout = 180 if a.dry_run else 240
    for name, known in (("models", models.FEATURES), ("configs", CONFIGS),
                        ("model-sides", MODEL_SIDES), ("gpt-sides", GPT_SIDES),
                        ("parts", ("gpt", "models"))):
        for x in getattr(a, name.replace("-", "_")).split(","):
            if x not in known:
                ap.error(f"--{name}: unknown '{x}' (known: {', '.join(known)})")
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ddp-gpu-bench-")
    try:
        b = Bench(a, tmp)
        b.probe()
        b.result["llmc_recompute"] = a.llmc_recompute
        b.write()
        parts = a.parts.split(",")
        if "gpt" in parts:
            b.gpt()
        if "models" in parts:
            b.models()
        b.write()
        print(render_md(b.result))
        for f in b.failures:
            print("FAILED:", f.replace("\n", " "))
        return 1 if b.failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
