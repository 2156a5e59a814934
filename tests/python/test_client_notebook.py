"""examples/notebook/ddp_client.ipynb executed headless (nbclient, a python3 kernel of
.venv-tools) against a real cluster (build/bin's coordinator and two workers on
loopback, tests/python/ddp_cluster.py): every cell runs without error, the job it
submits SUCCEEDS, and it draws its plot and shows its DataFrame. The notebook in the
repository is read, never written: it stays without outputs.

    .venv-tools/bin/python tests/python/test_client_notebook.py build/bin .
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_testlib  # noqa: E402
from ddp_cluster import Cluster, stage_example  # noqa: E402

BIN_DIR, SOURCE_DIR = client_testlib.args()
ddp_client = client_testlib.import_client(SOURCE_DIR)
NOTEBOOK = os.path.join(SOURCE_DIR, "examples", "notebook", "ddp_client.ipynb")


class NotebookTest(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(BIN_DIR, SOURCE_DIR, workers=2).start()
        self.addCleanup(self.cluster.stop)
        self.client = ddp_client.Client(self.cluster.address)
        self.addCleanup(self.client.close)
        self.cluster.wait_for_workers(self.client)
        self.examples = os.path.dirname(stage_example(SOURCE_DIR, "cancer.yaml",
                                                      self.cluster.dir))
        # The kernel inherits this environment.
        saved = dict(os.environ)
        self.addCleanup(lambda: (os.environ.clear(), os.environ.update(saved)))
        for name in ("DDP_TLS_CA", "DDP_TOKEN"):
            os.environ.pop(name, None)
        os.environ.update({"DDP_COORDINATOR": self.cluster.address,
                           "DDP_EXAMPLES_DIR": self.examples, "DDP_EXAMPLE_EPOCHS": "3"})

    def test_notebook_runs_headless(self):
        import nbclient
        import nbformat

        nb = nbformat.read(NOTEBOOK, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        self.assertTrue(code)
        for cell in code:
            self.assertEqual(cell.outputs, [], "the repository's notebook carries outputs")
            self.assertIsNone(cell.execution_count)
        runner = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                         resources={"metadata": {"path": self.cluster.dir}})
        try:
            runner.execute()
        except nbclient.exceptions.CellExecutionError as e:
            self.fail("a cell failed:\n%s\n%s" % (e, self.cluster.logs()))

        outputs = [o for c in code for o in c.outputs]
        self.assertEqual([o for o in outputs if o.output_type == "error"], [])
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        # The job it submitted ended SUCCEEDED, as the coordinator says too.
        done = re.search(r"^job (\S+) (\w+)", text, re.M)
        self.assertIsNotNone(done, text)
        job_id, state = done.groups()
        self.assertEqual(state, "SUCCEEDED", text)
        job = self.client.get(job_id)
        self.assertEqual(job["state"], "SUCCEEDED")
        self.assertEqual(job["workdir"], self.examples)
        self.assertEqual(job["epochs"], 3)
        self.assertEqual([j["id"] for j in self.client.list()], [job_id])
        # The watch table: lines of both ranks (the last update has both), each a step
        # the coordinator stored (a slow reader may skip steps, even epochs).
        history = self.client.metrics(job_id)
        stored = {(m["rank"], m["global_step"]): m for m in history}
        rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+\d+$", text, re.M)
        self.assertEqual({int(r[0]) for r in rows}, {0, 1}, text)
        for rank, epoch, step, loss in rows:
            m = stored.get((int(rank), int(step)))
            self.assertIsNotNone(m, "printed step %s of rank %s is not stored" % (step, rank))
            self.assertEqual((m["epoch"], "%.4f" % m["loss"]), (int(epoch), loss))
        # The plot and the DataFrame.
        data = [o.get("data", {}) for o in outputs
                if o.output_type in ("display_data", "execute_result")]
        self.assertTrue(any("image/png" in d for d in data), [list(d) for d in data])
        self.assertTrue(any("text/html" in d and "train_loss" in d["text/html"] for d in data))
        for rank in (0, 1):
            count = sum(1 for m in history if m["rank"] == rank)
            self.assertRegex(text, r"(?m)^%d\s+%d\s" % (rank, count))


if __name__ == "__main__":
    unittest.main(verbosity=2)
