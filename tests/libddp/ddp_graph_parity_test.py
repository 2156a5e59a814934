"""libddp's DistributedDataParallel on graphs that vary, against PyTorch's DDP, live.

    PYTHON ddp_graph_parity_test.py DDP_GRAPH_PROGRAM

PYTHON is the flavour's reference Python (Debian's torch 1.13 in build/, the venv's
2.x in build-torch2/). For 2 and 3 ranks and each case of ddp_graph_reference.py,
ddp_graph_program (libddp's public API, real ranks over Gloo/shared memory) must
reproduce PyTorch's per-step losses on every rank, which gradients are defined after
each backward (None and zeros differ: SGD with momentum skips a None), the last step's
gradients and the final parameters: bit for bit on 2 ranks (a + b is the same sum in
either order), within TOLERANCE on 3, where Gloo's ring and libddp's shared-memory sum
may add the three ranks in different orders.
"""
import json
import sys
import unittest

from local_ranks import assert_close, run_ranks, run_reference  # this directory

PROGRAM = None
TOLERANCE = 1e-6


def run_program(world, args):
    return run_ranks([PROGRAM] + args, world, prefix="ddp-graph-", timeout=120)


def reference(world, case):
    return run_reference("ddp_graph_reference.py", world, case)


class DdpGraphParityTest(unittest.TestCase):
    def close(self, got, want, exact, where):
        return assert_close(self, got, want, exact, TOLERANCE, where)

    def check(self, world, case):
        ref = reference(world, case)
        results = run_program(world, ["--case", case])
        exact = world == 2
        worst = 0.0
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank}: {err}")
            got = json.loads(out)
            want = ref["ranks"][rank]
            where = f"world {world} {case} rank {rank} (PyTorch {ref['torch']})"
            self.assertEqual("error" in got, "error" in want, f"{where}: {got.get('error')}")
            worst = max(worst, self.close(got["losses"], want["losses"], exact, f"{where} loss"))
            self.assertEqual(got["defined"], want["defined"], f"{where}: grads defined")
            self.assertEqual(len(got["params"]), len(want["params"]))
            for k, (g, w) in enumerate(zip(got["params"], want["params"])):
                worst = max(worst, self.close(g, w, exact, f"{where} param {k}"))
            if "error" not in want:
                for k, (g, w) in enumerate(zip(got["grads"], want["grads"])):
                    self.assertEqual(g is None, w is None, f"{where} grad {k}")
                    if w is not None:
                        worst = max(worst, self.close(g, w, exact, f"{where} grad {k}"))
        print(f"world {world} {case}: largest difference from PyTorch {worst:.3g}",
              file=sys.stderr)
        return ref, [json.loads(out) for _, out, _ in results]

    def test_undefined_grad_world2(self):
        self.check(2, "undefined")

    def test_undefined_grad_world3(self):
        self.check(3, "undefined")

    def test_find_unused_parameters_world2(self):
        self.check(2, "unused")

    def test_find_unused_parameters_world3(self):
        self.check(3, "unused")

    def test_static_graph_world2(self):
        self.check(2, "static")

    def test_static_graph_world3(self):
        self.check(3, "static")

    def test_static_graph_with_reentrant_checkpointing_world2(self):
        self.check(2, "checkpoint")

    def test_static_graph_with_reentrant_checkpointing_world3(self):
        self.check(3, "checkpoint")

    def check_error(self, world, case, what):
        ref, got = self.check(world, case)
        for rank, (g, w) in enumerate(zip(got, ref["ranks"])):
            for text in (g["error"], w["error"]):
                self.assertIn("Expected to have finished reduction in the prior iteration", text)
                self.assertIn(what, text)
            # PyTorch's line naming the parameters, word for word.
            [line] = [l for l in w["error"].split("\n") if l.startswith("Parameter indices")]
            self.assertIn(line + "\n", g["error"] + "\n", f"rank {rank}: {g['error']}")
            self.assertIn(f"Parameters which did not receive grad for rank {rank}: ", g["error"])

    def test_unused_parameter_without_the_flag_fails_the_next_forward(self):
        self.check_error(2, "error", "find_unused_parameters")

    def test_static_graph_that_changes_fails_the_next_forward(self):
        self.check_error(2, "static_error", "your training graph has changed")

    def test_find_unused_parameters_without_outputs_is_an_error(self):
        [(code, out, err)] = run_program(1, ["--case", "no_outputs"])
        self.assertEqual(code, 0, err)
        got = json.loads(out)
        self.assertEqual(got.get("error_code"), 1, got)  # ddp::ErrorCode::kFailedPrecondition
        self.assertEqual(got["message"], "names prepare_for_backward")


if __name__ == "__main__":
    PROGRAM = sys.argv.pop(1)
    unittest.main(verbosity=2)
