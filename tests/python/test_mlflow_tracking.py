"""MLflow tracking (ddp-coordinator --mlflow-uri) against a real MLflow tracking server:
PyPI's `mlflow server` (a temporary SQLite backend store, a loopback port) and a real
cluster (build/bin's coordinator and two workers) training two-rank jobs; the runs
are read back with MLflow's own client (mlflow.tracking.MlflowClient) and compared
with what the coordinator stored (the Python client's get(history=True)).

    .venv-tools/bin/python tests/python/test_mlflow_tracking.py build/bin .   # ctest: mlflow_tracking_test
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_testlib  # noqa: E402
from ddp_cluster import Cluster, free_port  # noqa: E402

BIN_DIR, SOURCE_DIR = client_testlib.args()
ddp_client = client_testlib.import_client(SOURCE_DIR)
try:
    from mlflow.tracking import MlflowClient
except ImportError as e:
    sys.exit("mlflow is not importable by %s (%s): run scripts/install_test_tools.sh" %
             (sys.executable, e))

JOB_TIMEOUT = 300
SECRET = "hunter2-do-not-send"


class MlflowServer:
    """`mlflow server` on a loopback port over a SQLite file; stop() and start() again
    keep its runs (the same file)."""

    def __init__(self, dir, port):
        self.dir = dir
        self.port = port
        self.proc = None

    @property
    def uri(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self):
        mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
        log = open(os.path.join(self.dir, "mlflow.log"), "ab")
        # Tracking only: MLflow 3's job execution (GenAI scorers) would start a job
        # runner and seven huey consumers beside the server, each importing mlflow
        # (a start took 29 CPU-s against 13 without them, and they poll while the test
        # runs), with a queue directory in /dev/shm that a killed server leaves behind.
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        self.proc = subprocess.Popen(
            [mlflow, "server", "--backend-store-uri",
             "sqlite:///" + os.path.join(self.dir, "mlflow.db"),
             "--default-artifact-root", os.path.join(self.dir, "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env)
        log.close()
        # About 26 s on a 2-core machine with a build beside it (two Python processes
        # importing mlflow, the SQLite store's migrations); side by side with other
        # tests, several times that. A bound for a server that never comes, not a timing target.
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("mlflow server exited: " + self.log())
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not come up: " + self.log())
            time.sleep(0.5)

    def stop(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # Gone at once, as a crashed host.
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def log(self):
        with open(os.path.join(self.dir, "mlflow.log"), errors="replace") as f:
            return f.read()[-3000:]


def job_spec(name, epochs, samples, tracking):
    return {
        "name": name,
        "nodes": 2,
        "env": {"API_TOKEN": SECRET},
        "model": {"mlp": {"hidden": [16]}},
        "data": {"synthetic": {"samples": samples, "features": 8, "classes": 2},
                 "validation": {"fraction": 0.25}},
        "train": {"epochs": epochs, "batch_size": 16,
                  "optimizer": {"name": "adam", "lr": 0.01}},
        "tracking": tracking,
    }


class MlflowTrackingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-mlflow-")
        ports = set()
        cls.server = MlflowServer(cls.dir, free_port(ports))
        cls.server.start()
        cls.cluster = Cluster(BIN_DIR, SOURCE_DIR,
                              coordinator_flags=["--mlflow-uri", cls.server.uri])
        cls.cluster.ports |= ports | {cls.server.port}
        cls.cluster.start()
        cls.client = ddp_client.Client(cls.cluster.address)
        cls.cluster.wait_for_workers(cls.client)
        cls.mlflow = MlflowClient(tracking_uri=cls.server.uri)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop()
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_of(self, experiment, job_id, status=None, timeout=120):
        """The job's run (found by its ddp.job_id tag), once it has `status`."""
        deadline = time.monotonic() + timeout
        while True:
            exp = self.mlflow.get_experiment_by_name(experiment)
            runs = [] if exp is None else self.mlflow.search_runs(
                [exp.experiment_id], "tags.`ddp.job_id` = '%s'" % job_id)
            if runs and (status is None or runs[0].info.status == status):
                self.assertEqual(len(runs), 1, "one run per job")
                return runs[0]
            if time.monotonic() > deadline:
                self.fail("no %s run of %s in experiment %s after %ds:\n%s" %
                          (status or "", job_id, experiment, timeout, self.cluster.logs()))
            time.sleep(0.5)

    def check_points(self, run, job_id):
        """Every stored point of every rank is in the run, once, with its step, value and
        time; the epochs too."""
        job = self.client.get(job_id, history=True)
        history = job["history"]
        self.assertGreater(len(history), 0)
        ranks = sorted({m["rank"] for m in history})
        self.assertEqual(ranks, [0, 1])
        for rank in ranks:
            for key, field in (("loss", "loss"), ("samples_per_s", "samples_per_s"),
                               ("step_time_ms", "step_ms"), ("comm_time_ms", "comm_ms")):
                want = sorted((m["global_step"], m["update_ms"], m[field])
                              for m in history if m["rank"] == rank)
                got = sorted((p.step, p.timestamp, p.value) for p in
                             self.mlflow.get_metric_history(run.info.run_id,
                                                            "%s/rank%d" % (key, rank)))
                self.assertEqual(got, want, "%s/rank%d" % (key, rank))
        epochs = job["epoch_history"]
        self.assertGreater(len(epochs), 0)
        got = sorted((p.step, p.value) for p in
                     self.mlflow.get_metric_history(run.info.run_id, "epoch/val_loss"))
        self.assertEqual(got, sorted((e["epoch"], e["val_loss"]) for e in epochs))
        return history

    def test_a_job_is_a_run_with_its_params_tags_every_point_and_its_end(self):
        job_id = self.client.submit(job_spec("mlflow-basic", 3, 1024,
                                             {"mlflow": {"experiment": "ddp-tests"}}))
        done = self.client.wait(job_id, timeout=JOB_TIMEOUT)
        self.assertEqual(done["state"], "SUCCEEDED", self.cluster.logs())
        run = self.run_of("ddp-tests", job_id, status="FINISHED")
        self.assertEqual(run.info.run_name, job_id)
        self.assertGreater(run.info.end_time, run.info.start_time)
        params = run.data.params
        self.assertEqual(params["name"], "mlflow-basic")
        self.assertEqual(params["train.optimizer.lr"], "0.01")
        self.assertEqual(params["model.mlp.hidden"], "[16]")
        self.assertEqual(params["data.synthetic.samples"], "1024")
        self.assertEqual(params["tracking.mlflow.experiment"], "ddp-tests")
        self.assertFalse([k for k in params if k.startswith("env")], params)
        self.assertNotIn(SECRET, " ".join(params.values()))
        tags = run.data.tags
        self.assertEqual(tags["ddp.job_id"], job_id)
        self.assertEqual(tags["ddp.attempt"], "1")
        self.assertIn("ddp.owner", tags)
        self.check_points(run, job_id)

    def test_points_kept_while_the_server_is_away_reach_it_when_it_is_back(self):
        spec = job_spec("mlflow-outage", 40, 2048, {"mlflow": True})
        spec["metrics"] = {"every_steps": 2}
        # The run is made when the job is queued (default experiment: the job's name);
        # the workers are cordoned meanwhile, so the job waits in the queue until the
        # server has gone, however long finding its run and stopping the server take.
        workers = [w["name"] for w in self.client.workers()]
        for w in workers:
            self.client.cordon(w)
        try:
            job_id = self.client.submit(spec)
            run = self.run_of("mlflow-outage", job_id)
            self.server.stop()
            self.assertIn(self.client.get(job_id)["state"], ("QUEUED", "PENDING"))
        finally:
            for w in workers:
                self.client.uncordon(w)
        done = self.client.wait(job_id, timeout=JOB_TIMEOUT)
        self.assertEqual(done["state"], "SUCCEEDED", self.cluster.logs())
        time.sleep(2)  # The coordinator retries meanwhile (and backs off).
        self.server.start()
        run = self.run_of("mlflow-outage", job_id, status="FINISHED", timeout=180)
        history = self.check_points(run, job_id)
        # Points stored while the server was away: the job's last ones are among them.
        last = max(m["update_ms"] for m in history)
        self.assertGreater(last, run.info.start_time)
        self.assertIn("is away", self.cluster.log("coordinator"))
        self.assertIn("answers again", self.cluster.log("coordinator"))

    def test_points_queued_when_the_coordinator_stops_reach_the_run_after_it_restarts(self):
        spec = job_spec("mlflow-restart", 40, 2048, {"mlflow": True})
        spec["metrics"] = {"every_steps": 2}
        job_id = self.client.submit(spec)
        run = self.run_of("mlflow-restart", job_id)
        # Some points reach the run, then the server goes: the rest wait in the
        # coordinator, which stops with them once the job has ended.
        deadline = time.monotonic() + JOB_TIMEOUT
        while not self.mlflow.get_metric_history(run.info.run_id, "loss/rank0"):
            self.assertLess(time.monotonic(), deadline, self.cluster.logs())
            time.sleep(0.2)
        self.server.stop()
        self.assertEqual(self.client.get(job_id)["state"], "RUNNING",
                         "the job ended before the server went: make it longer")
        done = self.client.wait(job_id, timeout=JOB_TIMEOUT)
        self.assertEqual(done["state"], "SUCCEEDED", self.cluster.logs())
        self.cluster.restart_coordinator()
        self.assertIn("points not sent", self.cluster.log("coordinator"))
        self.server.start()
        # The coordinator that starts sends what the run lacks, once, and ends it.
        run = self.run_of("mlflow-restart", job_id, status="FINISHED", timeout=180)
        # Once each: the points the run had before the stop are not sent again.
        self.check_points(run, job_id)
        self.assertIn("lacked are sent from the store's history", self.cluster.log("coordinator"))

    def test_jobs_opt_out_and_cannot_name_servers_the_coordinator_does_not_allow(self):
        job_id = self.client.submit(job_spec("mlflow-off", 1, 256, {"mlflow": False}))
        self.assertEqual(self.client.wait(job_id, timeout=JOB_TIMEOUT)["state"], "SUCCEEDED")
        exp = self.mlflow.get_experiment_by_name("mlflow-off")
        self.assertIsNone(exp, "an opted-out job makes neither a run nor its experiment")
        with self.assertRaises(ddp_client.InvalidSpec) as refused:
            self.client.submit(job_spec("mlflow-elsewhere", 1, 256,
                                        {"mlflow": {"uri": "http://169.254.169.254:80"}}))
        message = str(refused.exception)
        self.assertIn("tracking.mlflow.uri http://169.254.169.254:80", message)
        self.assertIn("--mlflow-allow", message)
        self.assertIn(self.server.uri, message)
        with self.assertRaises(ddp_client.InvalidSpec) as bad:
            self.client.submit(job_spec("mlflow-bad", 1, 256, {"mlflow": "ftp://x"}))
        self.assertIn("tracking.mlflow", str(bad.exception))
        self.assertIn("not an MLflow tracking server's address", str(bad.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
