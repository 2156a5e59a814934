"""libddp's ZeroRedundancyOptimizer against PyTorch's, live.

    PYTHON zero_parity_test.py ZERO_PROGRAM

PYTHON is the flavour's reference Python (Debian's torch 1.13 in build/, the venv's 2.x
in build-torch2/), which runs zero_reference.py: PyTorch's own ZeroRedundancyOptimizer
(parameters_as_bucket_view=False) under DDP, two param groups, on 2 and 3 ranks.
zero_program (libddp's public API, real ranks over Gloo/shared memory) must give

- the same partition of the parameters over the ranks (PyTorch's greedy rule);
- the same per-step losses on every rank and the same final parameters, within
  TOLERANCE (the bits where measured equal: SGD with momentum on 2 ranks);
- after the first steps, the consolidated state on rank 0 equal to PyTorch's
  consolidate_state_dict(0) + state_dict(), state by state (LibTorch keeps a
  parameter's state in an OptimizerParamState keyed by the parameter, PyTorch in a dict
  keyed by the parameter's index in the param groups: the index of a parameter in
  LibTorch's param groups is PyTorch's key, and the names are torch.optim's);

and, in the program itself, bit for bit: the ZeRO run against the same run with the
plain optimizer at every step and in its (consolidated) state; a plain optimizer resumed
from the ZeRO run's checkpoint (torch::save of the consolidated state), and a ZeRO one
resumed from the plain run's checkpoint, against the ZeRO run continuing. Then each
misuse must fail with a ddp::Error naming what to do, and one rank works as the plain
optimizer.
"""
import json
import math
import sys
import unittest

from local_ranks import run_ranks, run_reference  # this directory

PROGRAM = None
TOLERANCE = 1e-5  # library_parity_test's loss tolerance.
OPTIMIZERS = ["sgd", "adam", "adamw", "rmsprop", "adagrad"]
_references = {}


def run_program(world, args):
    return run_ranks([PROGRAM] + args, world, prefix="zero-parity-", timeout=240,
                     dir_flag="--dir")


def reference(world):
    """PyTorch's runs for every optimizer on `world` ranks (one launch, cached)."""
    if world not in _references:
        _references[world] = run_reference("zero_reference.py", world, ",".join(OPTIMIZERS))
    return _references[world]


def max_diff(a, b):
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


class ZeroParityTest(unittest.TestCase):
    def check(self, world, name, exact=False):
        ref = reference(world)
        want_all = ref[name]
        results = run_program(world, ["--optimizer", name])
        where = f"{name} world {world} (PyTorch {ref['torch']})"
        worst = 0.0
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank}: {err}")
            got = json.loads(out)
            want = want_all["ranks"][rank]
            at = f"{where} rank {rank}"
            # PyTorch's partition, the same on every rank.
            self.assertEqual(got["partition"], want["partition"], at)
            self.assertEqual(got["local_params"], len(want["partition"][rank]), at)
            # The C++ side's own bit-for-bit checks.
            self.assertEqual(got["zero_equals_plain"], 1, at)
            self.assertEqual(got["consolidated_equals_plain"], 1, at)
            self.assertEqual(got["consolidated"], 1 if rank == 0 else 0, at)
            self.assertEqual(got["resumed_plain_equals_zero"], 1, at)
            self.assertEqual(got["resumed_zero_equals_zero"], 1, at)
            # Against PyTorch.
            self.assertEqual(len(got["losses"]), len(want["losses"]), at)
            for step, (g, w) in enumerate(zip(got["losses"], want["losses"])):
                self.assertFalse(math.isnan(g), f"{at} step {step}")
                if exact:
                    self.assertEqual(g, w, f"{at} step {step}")
                self.assertAlmostEqual(g, w, delta=TOLERANCE, msg=f"{at} step {step}")
                worst = max(worst, abs(g - w))
            self.assertEqual(len(got["params"]), len(want["params"]), at)
            for i, (g, w) in enumerate(zip(got["params"], want["params"])):
                self.assertEqual(len(g), len(w), f"{at} parameter {i}")
                if exact:
                    self.assertEqual(g, w, f"{at} parameter {i}")
                d = max_diff(g, w)
                self.assertLessEqual(d, TOLERANCE, f"{at} parameter {i}")
                worst = max(worst, d)
        # Rank 0's consolidated state: every parameter's, PyTorch's names and values.
        got_state = json.loads(results[0][1])["state"]
        want_state = want_all["state"]
        self.assertEqual(sorted(got_state), sorted(want_state), where)
        self.assertEqual(want_all["param_groups"], [[0, 1, 2, 3], [4, 5]], where)
        for index, states in want_state.items():
            self.assertEqual(sorted(got_state[index]), sorted(states), f"{where} state {index}")
            for key, w in states.items():
                g = got_state[index][key]
                self.assertEqual(len(g), len(w), f"{where} state {index} {key}")
                if key == "step":
                    self.assertEqual(g, w, f"{where} state {index} step")
                    continue
                if exact:
                    self.assertEqual(g, w, f"{where} state {index} {key}")
                d = max_diff(g, w)
                self.assertLessEqual(d, TOLERANCE, f"{where} state {index} {key}")
                worst = max(worst, d)
        print(f"{where}: largest difference from PyTorch {worst:.3g}", file=sys.stderr)

    def test_sgd_momentum_world2(self):
        self.check(2, "sgd", exact=True)

    def test_sgd_momentum_world3(self):
        self.check(3, "sgd")

    def test_adam_world2(self):
        self.check(2, "adam")

    def test_adam_world3(self):
        self.check(3, "adam")

    def test_adamw_rmsprop_adagrad_world2(self):
        for name in ("adamw", "rmsprop", "adagrad"):
            with self.subTest(name):
                self.check(2, name)

    def test_misuse_names_what_to_do(self):
        [(code, out, err)] = run_program(1, ["--misuse"])
        self.assertEqual(code, 0, err)
        lines = dict(line.split(": ", 1) for line in out.strip().split("\n"))
        invalid = "0 2 ZeroRedundancyOptimizer: "  # kInvalidArgument, exit code 2 (permanent).
        for key in ("lbfgs", "lbfgs_factory", "empty", "no_group", "null_factory", "bad_rank",
                    "duplicate_group", "load_other"):
            self.assertTrue(lines[key].startswith(invalid), f"{key}: {lines[key]}")
        self.assertIn("LBFGS cannot be sharded", lines["lbfgs"])
        self.assertIn("Use a plain torch::optim::LBFGS on every rank", lines["lbfgs"])
        self.assertIn("LBFGS cannot be sharded", lines["lbfgs_factory"])
        self.assertIn("empty parameter list: pass the model's parameters", lines["empty"])
        self.assertIn("pass the one ddp::init_process_group() returned", lines["no_group"])
        self.assertIn("the optimizer factory returned no optimizer", lines["null_factory"])
        self.assertIn("consolidate_state_dict(3): no such rank in a group of 1",
                      lines["bad_rank"])
        self.assertTrue(lines["save_unconsolidated"].startswith("1 2 "),
                        lines["save_unconsolidated"])  # kFailedPrecondition.
        self.assertIn("call consolidate_state_dict(0) on every rank before saving",
                      lines["save_unconsolidated"])
        self.assertIn("appear in more than one parameter group", lines["duplicate_group"])
        self.assertIn("load a state saved from the same optimizer over the same param groups",
                      lines["load_other"])
        self.assertEqual(lines["world1_save"], "none")
        self.assertEqual(lines["world1_local_params"], "6")

    def test_param_groups_that_differ_across_ranks_fail_on_every_rank(self):
        results = run_program(2, ["--misuse-ranks"])
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank}: {err}")
            lines = dict(line.split(": ", 1) for line in out.strip().split("\n"))
            for key in ("differ", "differ_kind", "add_differ"):
                self.assertTrue(lines[key].startswith("0 2 "), f"rank {rank} {key}: {lines[key]}")
                self.assertIn("param groups that differ across ranks", lines[key])
                self.assertIn("every rank must pass the same parameters", lines[key])
            # add_param_group: the plain optimizer's bits; the head (48, 3) goes to the
            # rank with less (rank 1 owns 320 + 32 + 16 of the body, rank 0 the 512).
            self.assertEqual(lines["add_group_equals_plain"], "1", f"rank {rank}")
            self.assertEqual(lines["add_group_partition"], "[2] [0,1,3,4,5]", f"rank {rank}")
            if rank == 1:
                self.assertIn("rank 0 has Adam over 1 group: [320, 32, 512, 16, 48, 3], "
                              "rank 1 has Adam over 1 group: [320, 32, 512, 16, 48]",
                              lines["differ"])
                self.assertIn("rank 1 has SGD over", lines["differ_kind"])
                self.assertIn("add_param_group called", lines["add_differ"])


if __name__ == "__main__":
    PROGRAM = sys.argv.pop(1)
    unittest.main(verbosity=2)
