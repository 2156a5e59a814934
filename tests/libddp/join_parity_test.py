"""ddp::Join (uneven inputs) with DistributedDataParallel, against PyTorch's
Join([ddp_model]), live.

    PYTHON join_parity_test.py JOIN_PROGRAM

PYTHON is the flavour's reference Python (Debian's torch 1.13 in build/, the venv's
2.x in build-torch2/). For 2 and 3 ranks, rank r training on 5 + 2r batches (rank 0
runs out first, so the buffers must come from a rank still training and the final
model from the last to join), and each mode of join_reference.py
(divide_by_initial_world_size true and false, throw_on_early_termination),
join_program (libddp's public API, real ranks over Gloo/shared memory) must reproduce
PyTorch's per-step losses on every rank, which ranks throw and with which of PyTorch's
messages, the parameters and buffers every rank holds after the Join, and the loss and
parameters of one even step after it (divided by the world size again). Two more modes
put a ZeroRedundancyOptimizer in the Join after the model (PyTorch's
Join([ddp_model, zero_optim])): over SGD with momentum with zero_grad(set_to_none=False)
(a joined rank's ZeRO step sees zeros and still moves its shard by momentum) and over
Adam with set_to_none=True (it sees no gradients and leaves its shard), where the
optimizer state consolidated on rank 0 after the Join must match PyTorch's too: bit for bit
on 2 ranks (a + b + 0 is one sum in any order), within TOLERANCE on 3, where Gloo's
ring and libddp's shared-memory sum may add the three ranks in different orders, and
with Adam (torch 2.x's Python Adam rounds its update differently from LibTorch's). Then
the misuse cases each give a ddp::Error that says what to do.
"""
import json
import sys
import unittest

from local_ranks import assert_close, run_ranks, run_reference  # this directory

PROGRAM = None
TOLERANCE = 1e-6
MODES = ("divide", "nodivide", "throw", "zero_sgd", "zero_adam")


class JoinParityTest(unittest.TestCase):
    def close(self, got, want, exact, where):
        return assert_close(self, got, want, exact, TOLERANCE, where)

    def check(self, world):
        ref = run_reference("join_reference.py", world)
        results = run_ranks([PROGRAM], world, prefix="join-parity-", timeout=120)
        worst = 0.0
        got_all = []
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank}: {err}")
            got = json.loads(out)
            got_all.append(got)
            for mode in MODES:
                g, w = got["modes"][mode], ref["ranks"][rank][mode]
                exact = world == 2 and mode != "zero_adam"
                where = f"world {world} {mode} rank {rank} (PyTorch {ref['torch']})"
                self.assertEqual(len(g["losses"]), len(w["losses"]), where)
                worst = max(worst, self.close(g["losses"], w["losses"], exact, f"{where} loss"))
                if w["error"] is None:
                    self.assertIsNone(g["error"], where)
                else:
                    # PyTorch's RuntimeError text, then libddp's note on the option.
                    self.assertIsNotNone(g["error"], where)
                    self.assertIn(w["error"], g["error"], where)
                self.assertEqual("after" in g, "after" in w, where)
                if "after" in w:  # One even step after the Join, back to 1/world.
                    worst = max(worst, self.close([g["after"]], [w["after"]], exact,
                                                  f"{where} loss after the Join"))
                for kind in ("params", "buffers", "params_after"):
                    if kind not in w:
                        continue
                    self.assertEqual(len(g[kind]), len(w[kind]), f"{where} {kind}")
                    for k, (a, b) in enumerate(zip(g[kind], w[kind])):
                        worst = max(worst, self.close(a, b, exact, f"{where} {kind} {k}"))
                # ZeRO's state consolidated on rank 0 after the Join, PyTorch's names.
                self.assertEqual("state" in g, "state" in w, where)
                if "state" in w:
                    self.assertEqual(sorted(g["state"]), sorted(w["state"]), f"{where} state")
                    for index, states in w["state"].items():
                        self.assertEqual(sorted(g["state"][index]), sorted(states),
                                         f"{where} state {index}")
                        for key, want in states.items():
                            worst = max(worst, self.close(g["state"][index][key], want, exact,
                                                          f"{where} state {index} {key}"))
        # Uneven inputs really happened: rank r ran 5 + 2r steps, and after the Join
        # every rank holds the last joiner's model.
        for rank, got in enumerate(got_all):
            self.assertEqual(len(got["modes"]["divide"]["losses"]), 5 + 2 * rank)
            self.assertEqual(got["modes"]["divide"]["params"],
                             got_all[-1]["modes"]["divide"]["params"])
        self.assertNotEqual(got_all[0]["modes"]["divide"]["params"],
                            got_all[0]["modes"]["nodivide"]["params"])
        # With ZeRO over Adam and zero_grad(set_to_none=True), a joined rank's ZeRO step
        # has no gradients: its shard's Adam steps stop when it joins, so rank r's
        # parameters have taken 5 + 2r steps.
        steps = {s["step"][0] for s in got_all[0]["modes"]["zero_adam"]["state"].values()}
        self.assertEqual(sorted(steps), [5.0 + 2 * r for r in range(world)])
        print(f"world {world}: largest difference from PyTorch {worst:.3g}", file=sys.stderr)
        return got_all

    def check_misuse(self, got_all):
        for rank, got in enumerate(got_all):
            m = got["misuse"]
            where = f"rank {rank} misuse"
            self.assertIn("no joinables", m["no_joinables"], where)
            self.assertIn("requires at least one joinable", m["no_joinables"], where)
            self.assertIn("communication hook", m["comm_hook"], where)
            for option in ("find_unused_parameters", "static_graph"):
                self.assertIn(f"DdpOptions::{option}", m[option], where)
            self.assertIn("one Join at a time", m["two_joinables"], where)
            self.assertIn("already in an enabled Join", m["nested"], where)
            self.assertIn("called twice", m["finish_twice"], where)
            self.assertIn("one Join at a time per optimizer", m["zero_two_joinables"], where)
            self.assertIn("cannot be the first joinable: list the model first",
                          m["zero_first"], where)

    def test_world2(self):
        self.check_misuse(self.check(2))

    def test_world3(self):
        self.check_misuse(self.check(3))


if __name__ == "__main__":
    PROGRAM = sys.argv.pop(1)
    unittest.main(verbosity=2)
