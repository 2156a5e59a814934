#!/usr/bin/python3
"""Tests of python/ddp_report.py, the JSON-lines helper for command jobs.

    /usr/bin/python3 tests/python/test_ddp_report.py      (from the repository root)

Each test reloads the module under its own environment: the module reads DDP_EVENTS_FD
and DDP_REPORT_STDOUT at its first call.
"""

import contextlib
import importlib
import importlib.util
import io
import json
import math
import os
import sys
import time
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import ddp_report  # noqa: E402


class Scalar:
    """Stands in for a 0-d torch.Tensor or a NumPy scalar: float()/int() through .item()."""

    def __init__(self, value):
        self.value = value

    def item(self):
        return self.value


class DdpReportTest(unittest.TestCase):
    def setUp(self):
        self.read_fd, self.write_fd = os.pipe()
        self.open_fds = {self.read_fd, self.write_fd}
        self.addCleanup(lambda: [os.close(fd) for fd in self.open_fds])

    def close(self, fd):
        self.open_fds.discard(fd)
        os.close(fd)

    def report(self, **env):
        """ddp_report, freshly loaded under exactly these DDP_* variables."""
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("DDP_EVENTS_FD", "DDP_REPORT_STDOUT", "DDP_NOTICE_FILE")}
        clean.update(env)
        patcher = mock.patch.dict(os.environ, clean, clear=True)
        patcher.start()
        self.addCleanup(patcher.stop)
        return importlib.reload(ddp_report)

    def lines(self):
        self.close(self.write_fd)
        with os.fdopen(os.dup(self.read_fd), "rb") as f:
            data = f.read().decode("utf-8")
        self.assertTrue(data.endswith("\n"), data)
        return [json.loads(line) for line in data.splitlines()]

    def test_lines_on_the_pipe_are_json_with_the_fields(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        self.assertTrue(r.enabled())
        before = time.time()
        r.step(loss=0.42, epoch=0, step=3, steps=28, global_step=3, samples_per_s=812.0,
               step_ms=9.8, comm_ms=1.2, lr=1e-3)
        r.epoch(epoch=0, train_loss=0.3, val_loss=0.2, val_accuracy=0.97)
        r.checkpoint(path="ckpt/last.pt", epoch=0, step=27)
        step, epoch, ckpt = self.lines()
        self.assertEqual(step["type"], "step")
        self.assertEqual(list(step)[0], "type")
        for key, want in dict(loss=0.42, epoch=0, step=3, steps=28, global_step=3,
                              samples_per_s=812.0, step_ms=9.8, comm_ms=1.2, lr=1e-3).items():
            self.assertEqual(step[key], want, key)
        for key in ("epoch", "step", "steps", "global_step"):
            self.assertIsInstance(step[key], int, key)
        self.assertIsInstance(step["time"], float)
        self.assertGreaterEqual(step["time"], before - 1)
        self.assertLessEqual(step["time"], time.time() + 1)
        self.assertEqual({k: v for k, v in epoch.items() if k != "time"},
                         dict(type="epoch", epoch=0, train_loss=0.3, val_loss=0.2,
                              val_accuracy=0.97))
        self.assertEqual({k: v for k, v in ckpt.items() if k != "time"},
                         dict(type="checkpoint", path="ckpt/last.pt", epoch=0, step=27))

    def test_nan_and_infinity_become_null_and_none_is_left_out(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        r.step(loss=float("nan"), epoch=1, samples_per_s=float("inf"), step_ms=None)
        r.epoch(epoch=1, train_loss=-math.inf, val_loss=None, val_accuracy=None)
        r.step(loss=1.0, epoch=float("nan"), extra=[1.0, float("nan")])  # an int field: omitted
        step, epoch, odd = self.lines()
        self.assertIsNone(step["loss"])
        self.assertIn("loss", step)
        self.assertIsNone(step["samples_per_s"])
        self.assertNotIn("step_ms", step)
        self.assertIsNone(epoch["train_loss"])
        self.assertNotIn("val_loss", epoch)
        self.assertNotIn("val_accuracy", epoch)
        self.assertNotIn("epoch", odd)
        self.assertEqual(odd["extra"], [1.0, None])

    def test_tensor_like_values_are_converted(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        r.step(loss=Scalar(0.5), epoch=Scalar(2), step=Scalar(7.0), samples_per_s=Scalar(10),
               mine=Scalar(3))
        (step,) = self.lines()
        self.assertEqual(step["loss"], 0.5)
        self.assertEqual(step["epoch"], 2)
        self.assertEqual(step["step"], 7)
        self.assertIsInstance(step["step"], int)
        self.assertEqual(step["samples_per_s"], 10.0)
        self.assertEqual(step["mine"], 3)

    @unittest.skipUnless(importlib.util.find_spec("torch"), "no torch on this python")
    def test_torch_and_numpy_scalars(self):
        import numpy as np
        import torch
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        r.step(loss=torch.tensor(0.5), epoch=np.int64(2), step=torch.tensor(3),
               lr=np.float32(0.25), samples_per_s=torch.tensor(float("nan")), norm=np.float64(1.5))
        (step,) = self.lines()
        self.assertEqual((step["loss"], step["epoch"], step["step"], step["lr"], step["norm"]),
                         (0.5, 2, 3, 0.25, 1.5))
        self.assertIsNone(step["samples_per_s"])

    def test_extra_fields_pass_through(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        r.step(loss=0.1, grad_norm=2.5, phase="warmup", tags={"a": 1}, type="ignored")
        r.checkpoint(path="p.pt", epoch=3, bytes=1234, time=12.5)
        step, ckpt = self.lines()
        self.assertEqual(step["type"], "step")
        self.assertEqual(step["grad_norm"], 2.5)
        self.assertEqual(step["phase"], "warmup")
        self.assertEqual(step["tags"], {"a": 1})
        self.assertEqual(ckpt["bytes"], 1234)
        self.assertEqual(ckpt["time"], 12.5)

    def test_each_call_is_one_write_of_one_line(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        writes = []
        real = os.write
        with mock.patch.object(os, "write", lambda fd, b: writes.append(b) or real(fd, b)):
            r.step(loss=0.1, epoch=0)
            r.epoch(epoch=0)
        self.assertEqual(len(writes), 2)
        self.assertTrue(all(w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes))
        self.assertEqual(len(self.lines()), 2)

    def test_no_op_without_ddp_events_fd(self):
        r = self.report()
        self.assertFalse(r.enabled())
        out = io.StringIO()
        with mock.patch.object(os, "write", side_effect=AssertionError("wrote")), \
                contextlib.redirect_stdout(out):
            r.step(loss=0.1)
            r.epoch(epoch=0, val_accuracy=0.5)
            r.checkpoint(path="x")
        self.assertEqual(out.getvalue(), "")

    def test_stdout_when_asked(self):
        r = self.report(DDP_REPORT_STDOUT="1")
        self.assertTrue(r.enabled())
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            r.step(loss=0.25, step=1)
        line = json.loads(out.getvalue())
        self.assertEqual((line["type"], line["loss"], line["step"]), ("step", 0.25, 1))

    def test_a_closed_reader_turns_reporting_off_without_raising(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        self.close(self.read_fd)
        r.step(loss=0.1)  # EPIPE (Python ignores SIGPIPE): no exception
        self.assertFalse(r.enabled())
        with mock.patch.object(os, "write", side_effect=AssertionError("wrote")):
            r.step(loss=0.2)
            r.epoch(epoch=0)

    def test_a_closed_descriptor_turns_reporting_off_without_raising(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        self.close(self.write_fd)
        r.checkpoint(path="x", epoch=0)  # EBADF
        self.assertFalse(r.enabled())

    def test_a_line_over_64_kib_is_dropped(self):
        r = self.report(DDP_EVENTS_FD=str(self.write_fd))
        r.step(loss=0.1, blob="x" * 70000)
        r.step(loss=0.2)
        (line,) = self.lines()
        self.assertEqual(line["loss"], 0.2)
        self.assertTrue(r.enabled())

    def test_the_checkpoint_now_notice_is_read_and_asked_for_once_per_notice(self):
        import tempfile
        d = tempfile.mkdtemp(prefix="ddp-notice-")
        self.addCleanup(lambda: __import__("shutil").rmtree(d, ignore_errors=True))
        path = os.path.join(d, "notice")
        with open(path, "w") as f:
            f.write("0 0 \n")  # What ddp-worker writes before any notice.
        r = self.report(DDP_NOTICE_FILE=path)
        self.assertIsNone(r.notice())
        self.assertFalse(r.should_checkpoint())
        with open(path, "w") as f:
            f.write("1 1764000000500 worker w2 is draining\n")
        self.assertEqual(r.notice(), (1, 1764000000.5, "worker w2 is draining"))
        self.assertTrue(r.should_checkpoint())
        self.assertFalse(r.should_checkpoint(), "once per notice")
        with open(path, "w") as f:
            f.write("2 0 job big (higher priority) needs its nodes\n")
        self.assertEqual(r.notice(), (2, None, "job big (higher priority) needs its nodes"))
        self.assertTrue(r.should_checkpoint())
        with open(path, "w") as f:
            f.write("garbage\n")
        self.assertIsNone(r.notice())
        self.assertIsNone(self.report().notice(), "no DDP_NOTICE_FILE: no notice, ever")


if __name__ == "__main__":
    unittest.main()
