"""libddp's SyncBatchNorm and convert_sync_batchnorm against PyTorch's, live.

    PYTHON sync_batch_norm_parity_test.py SYNC_BATCH_NORM_PROGRAM

PYTHON is the flavour's reference Python (Debian's torch 1.13 in build/, the venv's
2.x in build-torch2/). For 1, 2 and 3 ranks and both models of
sync_batch_norm_reference.py (a BatchNorm1d MLP with momentum 0.1, a BatchNorm2d conv
net with momentum None, a BatchNorm1d on (N, C, L) with neither affine parameters nor
running statistics, which uses batch statistics in eval too, unsynchronised), with per-rank batch sizes that differ (one rank holding a
single row in one step, rank 0 none in another), sync_batch_norm_program (libddp's public API, real ranks over
Gloo/shared memory) must reproduce PyTorch's per-step losses on every rank, the running
statistics, num_batches_tracked and the eval loss. World 1 is the fallback to plain batch
norm, as in PyTorch. Then each misuse must fail with ddp::Error naming what to do.
"""
import json
import math
import sys
import unittest

from local_ranks import run_ranks, run_reference  # this directory

PROGRAM = None
TOLERANCE = 1e-5  # library_parity_test's loss tolerance.


def run_program(world, args):
    return run_ranks([PROGRAM] + args, world, prefix="sbn-parity-", timeout=240)


def reference(world, kind):
    return run_reference("sync_batch_norm_reference.py", world, kind)


class SyncBatchNormParityTest(unittest.TestCase):
    def check(self, world, kind):
        ref = reference(world, kind)
        results = run_program(world, ["--model", kind])
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank}: {err}")
            got = json.loads(out)
            want = ref["ranks"][rank]
            where = f"world {world} {kind} rank {rank} (PyTorch {ref['torch']})"
            self.assertEqual(len(got["losses"]), len(want["losses"]), where)
            for step, (g, w) in enumerate(zip(got["losses"], want["losses"])):
                if math.isnan(w):  # A rank with no rows: the mean of nothing.
                    self.assertTrue(math.isnan(g), f"{where} step {step}: {g}")
                    continue
                self.assertAlmostEqual(g, w, delta=TOLERANCE, msg=f"{where} step {step}")
            for key in ("running_mean", "running_var"):
                self.assertEqual(len(got[key]), len(want[key]), where)
                for c, (g, w) in enumerate(zip(got[key], want[key])):
                    self.assertAlmostEqual(g, w, delta=TOLERANCE, msg=f"{where} {key}[{c}]")
            self.assertEqual(got["num_batches_tracked"], want["num_batches_tracked"], where)
            self.assertAlmostEqual(got["eval_loss"], want["eval_loss"], delta=TOLERANCE, msg=where)
        # Synchronised statistics: every rank holds the same running statistics.
        if world > 1:
            first = json.loads(results[0][1])
            for _, out, _ in results[1:]:
                self.assertEqual(json.loads(out)["running_mean"], first["running_mean"])

    def test_mlp_world2(self):
        self.check(2, "mlp")

    def test_mlp_world3(self):
        self.check(3, "mlp")

    def test_conv_world2(self):
        self.check(2, "conv")

    def test_conv_world3(self):
        self.check(3, "conv")

    def test_plain_world2(self):
        self.check(2, "plain")

    def test_plain_world3(self):
        self.check(3, "plain")

    def test_world1_falls_back_to_batch_norm(self):
        self.check(1, "mlp")

    def test_misuse_names_what_to_do(self):
        [(code, out, err)] = run_program(1, ["--misuse"])
        self.assertEqual(code, 0, err)
        lines = dict(line.split(": ", 1) for line in out.strip().split("\n"))
        invalid = "0 2"  # ErrorCode::kInvalidArgument, exit code 2 (permanent).
        self.assertTrue(lines["1d_input"].startswith(invalid), lines["1d_input"])
        self.assertIn("expected at least 2D input (got 1D input", lines["1d_input"])
        self.assertIn("add the batch dimension", lines["1d_input"])
        self.assertTrue(lines["channels"].startswith(invalid), lines["channels"])
        self.assertIn("has 6 channels (dim 1), but num_features is 8", lines["channels"])
        self.assertIn("input channels should be non-zero", lines["zero_channels"])
        self.assertIn("pass the one ddp::init_process_group() returned", lines["no_group"])
        self.assertTrue(lines["member"].startswith(invalid), lines["member"])
        self.assertIn("'bn' (torch::nn::BatchNorm1d)", lines["member"])
        self.assertIn("Declare the member as ddp::SyncBatchNorm", lines["member"])
        self.assertEqual(lines["member_unchanged"], "1")
        self.assertEqual(lines["root_converted"], "1")
        self.assertEqual(lines["nested_converted"], "1")
        self.assertIn("Expected more than 1 value per channel when training", lines["one_value"])


if __name__ == "__main__":
    PROGRAM = sys.argv.pop(1)
    unittest.main(verbosity=2)
