"""libddp's fused optimizers against torch.optim with fused=True, live.

    PYTHON fused_optimizer_parity_test.py PROGRAM [--device cpu|cuda]

PYTHON is the flavour's reference Python (the venv's torch 2.x in build-torch2/, Debian's
1.13 in build/). PROGRAM is fused_optimizer_program (libddp's public API:
ddp::FusedAdamW, FusedAdam, FusedSGD), which runs one case per call; this script runs
the same steps in torch.optim with fused=True on the same device and compares, for
every case,

- the parameters after every step (6 steps, a learning rate that changes each step,
  five parameters of several shapes, one of 2112 elements) and the final state
  (torch.optim's names, its numbering across the param groups, the step counts);
- bit for bit: both sides call the same kernels with the same inputs;
- AdamW with and without weight decay, with amsgrad and with nanoGPT's two param
  groups; Adam with and without weight decay and amsgrad; SGD with momentum, Nesterov
  and weight decay, dampening, without momentum, and two groups;
- the learning rate as a tensor (set_lr_tensor; torch.optim given the same tensor):
  float32, and float64 on the CPU; and how far the tensor's step is from the same
  learning rate given as a number (decision 171: equal bits for Adam(W) with float32
  on a GPU, for every kernel with float64 on the CPU, for SGD with float32 on the CPU);
- with --device cuda, a CUDA graph: the first step eager, one captured and replayed for
  the rest (the program's --capture), against the eager run and torch.optim.

It prints one JSON line: {"device", "torch", "cases": {case: largest difference from
torch.optim}, "lr_tensor_vs_number": {case: largest difference}, "max_abs_diff"}. The
integrator's GPU check runs it with --device cuda (docs/library.md, Fused optimizers).
Under PyTorch 1.13, which has no fused kernels for the CPU, the program must refuse by
name instead.
"""
import json
import math
import subprocess
import sys
import unittest

import torch

PROGRAM = None
DEVICE = "cpu"
STEPS = 6
SHAPES = [(7, 5), (13,), (3, 4, 2), (1,), (64, 33)]
RESULTS = {"cases": {}, "lr_tensor_vs_number": {}}

# name -> the program's options (as keyword arguments, underscores for dashes).
CASES = {
    "adamw_weight_decay": dict(optimizer="adamw", lr=1e-3, weight_decay=0.1),
    "adamw_no_weight_decay": dict(optimizer="adamw", lr=3e-3),
    "adamw_amsgrad": dict(optimizer="adamw", lr=1e-3, weight_decay=0.01, amsgrad=True),
    "adamw_matrices": dict(optimizer="adamw", lr=6e-4, weight_decay=0.1, matrices=True),
    "adam": dict(optimizer="adam", lr=1e-2),
    "adam_weight_decay_amsgrad": dict(optimizer="adam", lr=1e-3, weight_decay=0.01, amsgrad=True),
    "sgd_momentum": dict(optimizer="sgd", lr=0.1, momentum=0.9),
    "sgd_nesterov_weight_decay": dict(optimizer="sgd", lr=0.05, momentum=0.9, nesterov=True,
                                      weight_decay=1e-4),
    "sgd_dampening": dict(optimizer="sgd", lr=0.1, momentum=0.5, dampening=0.1),
    "sgd_no_momentum": dict(optimizer="sgd", lr=0.1, weight_decay=0.01),
    "sgd_matrices": dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.01, matrices=True),
}


def has_fused_kernels():
    return int(torch.__version__.split(".")[0]) >= 2


def argv_of(opts):
    argv = [PROGRAM, "--device", DEVICE, "--steps", str(STEPS)]
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv


def run_program(opts):
    out = subprocess.run(argv_of(opts), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def lr_at(opts, step):
    return opts["lr"] * (1.0 - 0.1 * step)


def reference(opts):
    """torch.optim with fused=True: the parameters after each step and the state_dict."""
    device = torch.device(DEVICE)
    params = []
    for i, shape in enumerate(SHAPES):
        n = math.prod(shape)
        v = torch.sin(torch.linspace(-1, 1, n) * (0.5 + 0.1 * i))
        params.append(v.reshape(shape).to(device).requires_grad_(True))
    wd = opts.get("weight_decay", 0.0)
    if opts.get("matrices"):
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": wd}]
    lr_kind = opts.get("lr_tensor", "none")
    lr = opts["lr"]
    if lr_kind != "none":
        dtype = torch.float64 if lr_kind == "float64" else torch.float32
        lr = torch.tensor(opts["lr"], dtype=dtype, device=device)
    name = opts["optimizer"]
    if name == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=opts.get("momentum", 0.0),
                              dampening=opts.get("dampening", 0.0),
                              nesterov=opts.get("nesterov", False), fused=True)
    else:
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        opt = cls(groups, lr=lr, amsgrad=opts.get("amsgrad", False), fused=True)
    rows = []
    for step in range(STEPS):
        for i, p in enumerate(params):
            g = torch.cos(torch.linspace(0.3, -0.7, p.numel()) * float(step + 1 + i)) * (0.1 * (i + 1))
            p.grad = g.reshape(p.shape).to(device)
        if isinstance(lr, torch.Tensor):
            lr.fill_(lr_at(opts, step))
        else:
            for group in opt.param_groups:
                group["lr"] = lr_at(opts, step)
        opt.step()
        rows.append(torch.cat([p.detach().reshape(-1) for p in params]).cpu())
    return rows, opt.state_dict()


def as_tensor(values):
    return torch.tensor(values, dtype=torch.float32)


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


class FusedOptimizerParityTest(unittest.TestCase):
    def compare(self, name, opts, exact=True):
        got = run_program(opts)
        self.assertNotIn("refused", got, name)
        want_rows, want_state = reference(opts)
        self.assertEqual(len(got["params"]), STEPS, name)
        worst = 0.0
        for step, (g, w) in enumerate(zip(got["params"], want_rows)):
            g = as_tensor(g)
            self.assertEqual(g.shape, w.shape, name)
            d = max_diff(g, w)
            worst = max(worst, d)
            if exact:
                self.assertTrue(torch.equal(g, w), f"{name} step {step}: {d}")
        # The final state, torch.optim's names and numbering.
        state = want_state["state"]
        self.assertEqual(sorted(int(k) for k in got["state"]), sorted(state), name)
        for index, entries in state.items():
            mine = got["state"][str(index)]
            self.assertEqual(sorted(mine), sorted(entries), f"{name} state {index}")
            for key, value in entries.items():
                w = value.detach().reshape(-1).cpu().float()
                g = as_tensor(mine[key])
                d = max_diff(g, w)
                worst = max(worst, d)
                if exact:
                    self.assertTrue(torch.equal(g, w), f"{name} state {index} {key}: {d}")
        if opts["optimizer"] != "sgd":  # Each step count: float32 on the parameter's device.
            device = "cuda:0" if DEVICE == "cuda" else "cpu"
            self.assertEqual(got["step_where"], f"{device} Float 0", name)
            for index in state:
                self.assertEqual(got["state"][str(index)]["step"], [float(STEPS)], name)
        RESULTS["cases"][name] = worst
        return got

    def test_against_torch_optim_fused(self):
        if not has_fused_kernels():
            self.skipTest(f"PyTorch {torch.__version__} has no fused optimizer kernels here")
        for name, opts in CASES.items():
            with self.subTest(name):
                self.compare(name, opts)

    def test_lr_tensor(self):
        if not has_fused_kernels():
            self.skipTest(f"PyTorch {torch.__version__} has no fused optimizer kernels here")
        kinds = ["float32"] + (["float64"] if DEVICE == "cpu" else [])
        for base in ("adamw_weight_decay", "adam_weight_decay_amsgrad", "sgd_nesterov_weight_decay",
                     "sgd_matrices"):
            number = run_program(CASES[base])
            for kind in kinds:
                name = f"{base}_lr_{kind}"
                with self.subTest(name):
                    got = self.compare(name, dict(CASES[base], lr_tensor=kind))
                    d = max(max_diff(as_tensor(a), as_tensor(b))
                            for a, b in zip(got["params"], number["params"]))
                    RESULTS["lr_tensor_vs_number"][name] = d
                    sgd = CASES[base]["optimizer"] == "sgd"
                    # Decision 171: where the kernels see the same lr either way.
                    if kind == "float64" or (DEVICE == "cpu" and sgd) or (DEVICE == "cuda" and not sgd):
                        self.assertEqual(d, 0.0, name)
                    else:  # A float32-rounded lr: a last-bit difference at most per step.
                        self.assertLess(d, 1e-6, name)

    def test_captured_step_replays_as_the_eager_one(self):
        if DEVICE != "cuda":
            self.skipTest("CUDA graphs: --device cuda")
        for base in ("adamw_weight_decay", "adam_weight_decay_amsgrad", "sgd_nesterov_weight_decay",
                     "adamw_matrices"):
            name = f"{base}_captured"
            with self.subTest(name):
                got = self.compare(name, dict(CASES[base], lr_tensor="float32", capture=True))
                for step, (a, b) in enumerate(zip(got["params"], got["eager_params"])):
                    self.assertEqual(a, b, f"{name} step {step}: the replay differs from eager")

    def test_refused_by_name_without_fused_kernels(self):
        if has_fused_kernels():
            self.skipTest(f"PyTorch {torch.__version__} has them")
        for name, cls in (("adamw", "FusedAdamW"), ("adam", "FusedAdam"), ("sgd", "FusedSGD")):
            got = run_program(dict(optimizer=name, lr=0.1))
            self.assertIn("refused", got, name)
            self.assertEqual(got["exit_code"], 2, name)  # Permanent: kFailedPrecondition.
            self.assertIn(f"ddp::{cls} needs LibTorch 2.x", got["refused"])


def main():
    global PROGRAM, DEVICE
    args = sys.argv[1:]
    PROGRAM = args.pop(0)
    if "--device" in args:
        i = args.index("--device")
        DEVICE = args[i + 1]
        del args[i:i + 2]
    result = unittest.main(argv=[sys.argv[0]] + args, verbosity=2, exit=False).result
    values = list(RESULTS["cases"].values())
    print(json.dumps({"device": DEVICE, "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else None,
                      "cases": RESULTS["cases"],
                      "lr_tensor_vs_number": RESULTS["lr_tensor_vs_number"],
                      "max_abs_diff": max(values) if values else None}), flush=True)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
