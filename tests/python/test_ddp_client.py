"""The Python client (python/ddp_client) against a real cluster: build/bin's
ddp-coordinator and two ddp-workers on loopback, training examples/cancer.yaml (cut
to a few epochs) with the real ddp-trainer; then the same over TLS with tokens.

    .venv-tools/bin/python tests/python/test_ddp_client.py build/bin .   # ctest: python_client_test
"""
import json
import math
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_testlib  # noqa: E402
from ddp_cluster import Cluster, free_port, stage_example  # noqa: E402

BIN_DIR, SOURCE_DIR = client_testlib.args()
ddp_client = client_testlib.import_client(SOURCE_DIR)
JOB_TIMEOUT = 240  # Seconds a few-epoch job may take on two loaded cores.


def staged_job(cluster, name, epochs):
    """examples/cancer.yaml staged in the cluster's directory, renamed and cut to
    `epochs`: (its path, its text)."""
    path = stage_example(SOURCE_DIR, "cancer.yaml", cluster.dir)
    with open(path) as f:
        text = f.read()
    assert "name: cancer-ddp\n" in text and "  epochs: 100\n" in text, text
    text = text.replace("name: cancer-ddp\n", "name: %s\n" % name)
    text = text.replace("  epochs: 100\n", "  epochs: %d\n" % epochs)
    out = os.path.join(os.path.dirname(path), name + ".yaml")
    with open(out, "w") as f:
        f.write(text)
    return out, text


def cancer_dict(name, epochs):
    """examples/cancer.yaml as a dict (what a notebook would write)."""
    return {
        "name": name, "nodes": 2, "nproc_per_node": 1, "backend": "auto",
        "model": {"mlp": {"hidden": [64, 32]}},
        "data": {"csv": {"path": "../data/breast_cancer.csv", "skip_rows": 1,
                         "label_column": -1, "standardize": True},
                 "validation": {"fraction": 0.2}, "seed": 0},
        "train": {"epochs": epochs, "batch_size": 8, "drop_last": True, "shuffle": True,
                  "optimizer": {"name": "adam", "lr": 0.001}, "loss": "cross_entropy",
                  "seed": 0},
        "metrics": {"every_steps": 1},
    }


class ClientTest(unittest.TestCase):
    """Plaintext on loopback, no tokens: the quickstart's coordinator."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(BIN_DIR, SOURCE_DIR, workers=2).start()
        try:
            cls.client = ddp_client.Client(cls.cluster.address)
            cls.cluster.wait_for_workers(cls.client)
            cls.file, cls.text = staged_job(cls.cluster, "cancer-file", epochs=2)
            cls.examples = os.path.dirname(cls.file)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop()

    def wait_ok(self, job_id):
        job = self.client.wait(job_id, timeout=JOB_TIMEOUT)
        self.assertEqual(job["state"], "SUCCEEDED",
                         "%s: %s\n%s" % (job_id, job["reason"], self.cluster.logs()))
        return job

    def test_1_workers(self):
        workers = self.client.workers()
        self.assertEqual([w["name"] for w in workers], ["w1", "w2"])
        for w in workers:
            self.assertTrue(w["alive"], w)
            self.assertEqual(w["slots"], 1)
            self.assertTrue(w["version"])
        self.assertEqual(self.client.workers(limit=1)[0]["name"], "w1")
        summary = self.client.worker_summary()
        self.assertEqual((summary["workers"], summary["alive"], summary["slots"]), (2, 2, 2))
        self.assertTrue(summary["coordinator_version"].startswith("0."), summary)

    def test_2_submit_forms_watch_and_history(self):
        # A file (relative paths against its directory, as ddpctl), a YAML string and a
        # dict (with an explicit workdir): all three train to the end.
        by_file = self.client.submit(self.file)
        by_text = self.client.submit(self.text.replace("cancer-file", "cancer-text"),
                                     workdir=self.examples)
        by_dict = self.client.submit(cancer_dict("cancer-dict", epochs=2),
                                     workdir=self.examples)
        self.assertTrue(by_file.startswith("cancer-file-"), by_file)
        self.assertTrue(by_text.startswith("cancer-text-"), by_text)
        self.assertTrue(by_dict.startswith("cancer-dict-"), by_dict)

        updates = list(self.client.watch(by_file, timeout=JOB_TIMEOUT))
        self.assertEqual(self.wait_ok(by_file)["id"], by_file)
        self.assertEqual({u["rank"] for u in updates}, {0, 1})
        self.assertTrue(all(u["job_id"] == by_file for u in updates))
        self.assertIn(updates[-1]["state"], ("RUNNING", "SUCCEEDED"))
        # Every watched update is a step the coordinator stored, with the same values.
        history = self.client.metrics(by_file)
        stored = {(m["rank"], m["attempt"], m["global_step"]): m for m in history}
        self.assertEqual({m["rank"] for m in history}, {0, 1})
        for u in updates:
            key = (u["rank"], u["attempt"], u["global_step"])
            self.assertIn(key, stored, "watched step %s is not in the stored history" % (key,))
            for field in ("loss", "epoch", "step", "steps", "samples_per_s"):
                self.assertEqual(u[field], stored[key][field], (field, key))
        for rank in (0, 1):
            steps = [m["global_step"] for m in history if m["rank"] == rank]
            self.assertEqual(steps, sorted(steps))
            self.assertTrue(all(math.isfinite(m["loss"]) for m in history))
        # get(history=True) and metrics() agree; the latest per rank is the last stored.
        job = self.client.get(by_file)
        self.assertEqual(job["state"], "SUCCEEDED")
        self.assertEqual(job["workdir"], self.examples)
        self.assertEqual(job["epochs"], 2)
        self.assertEqual(len(self.client.epochs(by_file)), 2)
        for m in job["metrics"]:
            last = max((h for h in history if h["rank"] == m["rank"]),
                       key=lambda h: h["global_step"])
            self.assertEqual((m["global_step"], m["loss"]), (last["global_step"], last["loss"]))
        frame = self.client.metrics_frame(by_file)
        self.assertEqual(len(frame), len(history))
        self.assertEqual(list(frame["loss"]), [m["loss"] for m in history])

        for job_id, name in ((by_text, "cancer-text"), (by_dict, "cancer-dict")):
            job = self.wait_ok(job_id)
            self.assertEqual(job["name"], name)
            self.assertEqual(job["workdir"], self.examples)
            self.assertTrue(self.client.metrics(job_id))
        # The dict went as JSON text, which the coordinator stored as sent.
        self.assertEqual(json.loads(self.client.get(by_dict)["spec_yaml"]),
                         cancer_dict("cancer-dict", epochs=2))
        # A finished job: wait returns at once, watch yields its last state and ends.
        self.assertEqual(self.client.wait(by_dict, timeout=10)["state"], "SUCCEEDED")

        # list: newest first, all three in it.
        listed = self.client.list()
        ids = [j["id"] for j in listed]
        for job_id in (by_file, by_text, by_dict):
            self.assertIn(job_id, ids)
        self.assertEqual([j["submit_ms"] for j in listed],
                         sorted((j["submit_ms"] for j in listed), reverse=True))
        self.assertEqual(len(self.client.list(limit=1)), 1)

        # logs: every stored line; by rank; the tail; follow on an ended job ends.
        lines = self.client.logs(by_file)
        self.assertTrue(lines)
        self.assertEqual({l["rank"] for l in lines} - {-1, 0, 1}, set())
        self.assertEqual([l["seq"] for l in lines], sorted(l["seq"] for l in lines))
        rank1 = self.client.logs(by_file, rank=1)
        self.assertTrue(rank1)
        self.assertTrue(all(l["rank"] == 1 for l in rank1))
        self.assertEqual(self.client.logs(by_file, tail=2), lines[-2:])
        self.assertEqual([l["seq"] for l in self.client.follow_logs(by_file)],
                         [l["seq"] for l in lines])

    def test_3_cancel_running_job(self):
        # A YAML string without workdir: relative paths resolve against the current
        # directory.
        long_text = self.text.replace("cancer-file", "cancer-long").replace(
            "  epochs: 2\n", "  epochs: 1000\n")
        cwd = os.getcwd()
        os.chdir(self.examples)
        try:
            job_id = self.client.submit(long_text)
        finally:
            os.chdir(cwd)
        self.assertEqual(self.client.get(job_id)["workdir"], self.examples)
        for job in self.client.watch_jobs(job_id, timeout=JOB_TIMEOUT):
            if job["state"] == "RUNNING" and len(job["metrics"]) == 2:
                break
        else:
            self.fail("the job ended before it ran: %s" % self.client.get(job_id)["reason"])
        cancelled = self.client.cancel(job_id)
        self.assertEqual(cancelled["state"], "CANCELLED")
        self.assertTrue(all(a["live_trainers"] == 0 for a in cancelled["attempts"]),
                        cancelled["attempts"])
        self.assertEqual(self.client.wait(job_id, timeout=30)["state"], "CANCELLED")
        with self.assertRaises(ddp_client.FailedPrecondition) as ctx:
            self.client.cancel(job_id)
        self.assertIn(job_id, ctx.exception.message)

    def test_4_bad_spec_carries_the_coordinator_message(self):
        bad = cancer_dict("bad", epochs=1)
        bad["train"]["batch_size"] = 0
        with self.assertRaises(ddp_client.InvalidSpec) as ctx:
            self.client.submit(bad, workdir=self.examples)
        e = ctx.exception
        self.assertEqual(e.code.name, "INVALID_ARGUMENT")
        self.assertIn("train.batch_size", e.message)
        self.assertEqual(e.coordinator, self.cluster.address)
        self.assertIsInstance(e, ddp_client.DdpError)
        with self.assertRaises(ddp_client.InvalidSpec) as ctx:
            self.client.submit(self.text.replace("  epochs: 2", "  epoch: 2"),
                               source_name="typo.yaml")
        self.assertIn("typo.yaml", ctx.exception.message)
        self.assertIn("did you mean epochs", ctx.exception.message)
        self.assertNotIn("bad", [j["name"] for j in self.client.list()])

    def test_5_unknown_job_is_not_found(self):
        for call in (lambda: self.client.get("no-such-job"),
                     lambda: self.client.cancel("no-such-job"),
                     lambda: self.client.wait("no-such-job", timeout=10),
                     lambda: self.client.logs("no-such-job")):
            with self.assertRaises(ddp_client.NotFound) as ctx:
                call()
            self.assertIn("no-such-job", ctx.exception.message)
            self.assertEqual(ctx.exception.code.name, "NOT_FOUND")

    def test_6_addresses(self):
        # Several coordinators: one that is down is skipped for the one that answers.
        down = "127.0.0.1:%d" % free_port(set(self.cluster.ports))
        with ddp_client.Client("%s, %s" % (down, self.cluster.address)) as c:
            self.assertEqual(len(c.workers()), 2)
            self.assertEqual(c.coordinator, self.cluster.address)
        with ddp_client.Client(down, timeout=3) as c:
            with self.assertRaises(ddp_client.Unavailable):
                c.list()
        with self.assertRaises(ValueError):
            ddp_client.Client("no-port")
        # $DDP_COORDINATOR is the default address.
        old = os.environ.get("DDP_COORDINATOR")
        os.environ["DDP_COORDINATOR"] = self.cluster.address
        try:
            with ddp_client.Client() as c:
                self.assertEqual(c.coordinator, self.cluster.address)
                self.assertEqual(len(c.workers()), 2)
        finally:
            if old is None:
                del os.environ["DDP_COORDINATOR"]
            else:
                os.environ["DDP_COORDINATOR"] = old


    def test_7_watch_rides_out_a_coordinator_restart(self):
        long_text = self.text.replace("cancer-file", "cancer-restart").replace(
            "  epochs: 2\n", "  epochs: 1000\n")
        job_id = self.client.submit(long_text, workdir=self.examples)
        updates = self.client.watch(job_id, timeout=JOB_TIMEOUT)
        before = {}
        for u in updates:
            before[u["rank"]] = u["global_step"]
            if u["state"] == "RUNNING" and len(before) == 2:
                break
        else:
            self.fail("the job ended before it ran: %s" % self.client.get(job_id)["reason"])
        self.cluster.restart_coordinator()
        restarted_ms = time.time() * 1000
        # The same iterator goes on past the restart (a new stream), with steps the new
        # coordinator received: the trainers kept training.
        for u in updates:
            if u["update_ms"] > restarted_ms and u["global_step"] > before[u["rank"]]:
                break
        else:
            self.fail("no update after the coordinator restarted")
        self.assertEqual(self.client.cancel(job_id)["state"], "CANCELLED")
        rest = list(updates)
        self.assertTrue(all(u["job_id"] == job_id for u in rest))
        self.assertEqual(self.client.wait(job_id, timeout=30)["state"], "CANCELLED")


class ClientUnitTest(unittest.TestCase):
    """What the client decides without a coordinator."""

    def test_parse_coordinators(self):
        self.assertEqual(ddp_client.parse_coordinators(" a:1, b:2 ,"), ["a:1", "b:2"])
        self.assertEqual(ddp_client.parse_coordinators("[::1]:29400"), ["[::1]:29400"])
        for bad in ("", "a", "a:0", "a:x", ":1", "a:1,b"):
            with self.assertRaises(ValueError, msg=bad):
                ddp_client.parse_coordinators(bad)

    def test_follows_the_leader_a_standby_names(self):
        class NotLeader:
            def __init__(self, details):
                self._details = details

            def details(self):
                return self._details

        c = ddp_client.Client("a:1,b:2,c:3")
        self.assertEqual(c._next_coordinator(NotLeader(
            "not the leader: lease held; the leader is at c:3")), 2)
        # A leader not in our list, or none named: the next address.
        self.assertEqual(c._next_coordinator(NotLeader(
            "not the leader: lease held; the leader is at d:4")), 1)
        self.assertEqual(c._next_coordinator(NotLeader("connection refused")), 1)
        c.close()

    def test_workdir_named_by_the_spec(self):
        from ddp_client.client import _names_workdir
        self.assertTrue(_names_workdir("name: x\nworkdir: /srv/x\n"))
        self.assertTrue(_names_workdir('{"name": "x", "workdir": "/srv/x"}'))
        self.assertTrue(_names_workdir("{name: x,\n workdir: /srv/x}"))
        self.assertFalse(_names_workdir("name: x\n# workdir: /srv/x\n"))
        self.assertFalse(_names_workdir("name: x\ndata: {csv: {path: workdir.csv}}\n"))

    def test_messages_as_plain_values(self):
        from ddp_client._proto.ddp.v1 import types_pb2
        m = types_pb2.RankMetrics(rank=1, global_step=2 ** 40, loss=0.5,
                                  gpu_memory_peak_mib=3.0)
        d = ddp_client.message_to_dict(m)
        self.assertEqual(d["global_step"], 2 ** 40)  # An int, not a string.
        self.assertEqual((d["gpu_memory_peak_mib"], d["gpu_memory_allocated_mib"]), (3.0, None))
        job = ddp_client.message_to_dict(types_pb2.Job(
            id="j", state=types_pb2.RUNNING, node_selector={"pool": "a"},
            metrics=[m], attempts=[types_pb2.Attempt(number=1)]))
        self.assertEqual(job["state"], "RUNNING")
        self.assertEqual(job["preemption"], "PREEMPT_AT_CHECKPOINT")
        self.assertEqual(job["node_selector"], {"pool": "a"})
        self.assertEqual(job["metrics"][0]["rank"], 1)
        self.assertEqual(job["attempts"][0]["number"], 1)

    def test_submit_refuses_what_is_not_a_spec(self):
        c = ddp_client.Client("127.0.0.1:1")
        with self.assertRaises(TypeError):
            c.submit(42)
        with self.assertRaises(ValueError):
            c.submit({"name": "x"}, workdir="relative/dir")
        c.close()


class SecureClientTest(unittest.TestCase):
    """TLS (the test CA from scripts/make_certs.sh), worker certificates and tokens."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(BIN_DIR, SOURCE_DIR, workers=2, secure=True).start()
        try:
            cls.ca = os.path.join(cls.cluster.certs, "ca.pem")
            cls.client = ddp_client.Client(cls.cluster.address, tls_ca=cls.ca,
                                           token_file=cls.cluster.token_file("user"))
            cls.cluster.wait_for_workers(cls.client)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop()

    def test_job_over_tls_with_a_token(self):
        path, _ = staged_job(self.cluster, "cancer-tls", epochs=1)
        job_id = self.client.submit(path)
        job = self.client.wait(job_id, timeout=JOB_TIMEOUT)
        self.assertEqual(job["state"], "SUCCEEDED", job["reason"])
        self.assertEqual(job["owner"], "user")
        self.assertTrue(self.client.metrics(job_id))
        # A viewer reads but may not cancel; the coordinator's message says so.
        with open(self.cluster.token_file("viewer")) as f:
            viewer = ddp_client.Client(self.cluster.address, tls_ca=self.ca, token=f.read().strip())
        with viewer:
            self.assertEqual(viewer.get(job_id)["state"], "SUCCEEDED")
            with self.assertRaises(ddp_client.PermissionDenied) as ctx:
                viewer.cancel(job_id)
            self.assertIn("CancelJob", ctx.exception.message)

    def test_refusals(self):
        with ddp_client.Client(self.cluster.address, tls_ca=self.ca) as anonymous:
            with self.assertRaises(ddp_client.Unauthenticated) as ctx:
                anonymous.list()
            self.assertIn("requires authentication", ctx.exception.message)
        with ddp_client.Client(self.cluster.address, timeout=5) as plaintext:
            with self.assertRaises(ddp_client.Unavailable):
                plaintext.list()
        with self.assertRaises(ValueError) as ctx:
            ddp_client.Client("10.0.0.1:29400", token="x" * 20)
        self.assertIn("plaintext", str(ctx.exception))
        with self.assertRaises(ValueError):
            ddp_client.Client(self.cluster.address, tls_ca=self.ca, token="short")

    def test_environment(self):
        # $DDP_TLS_CA and $DDP_TOKEN, as ddpctl takes them.
        with open(self.cluster.token_file("admin")) as f:
            env = {"DDP_COORDINATOR": self.cluster.address, "DDP_TLS_CA": self.ca,
                   "DDP_TOKEN": f.read().strip()}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with ddp_client.Client() as c:
                self.assertEqual([w["name"] for w in c.workers()], ["w1", "w2"])
                # An admin may take a worker out of service and back.
                self.assertEqual(c.cordon("w2")["maintenance"], "WORKER_CORDONED")
                self.assertEqual(c.uncordon("w2")["maintenance"], "WORKER_SCHEDULABLE")
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


if __name__ == "__main__":
    unittest.main(verbosity=2)
