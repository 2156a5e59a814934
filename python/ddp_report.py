"""ddp_report: live metrics from your own training program to ddp (stdlib only, Python 3.7+).

    import ddp_report as report
    report.step(loss=loss.item(), epoch=epoch, step=i, steps=len(loader), samples_per_s=812.0)
    report.epoch(epoch=epoch, train_loss=0.31, val_loss=0.27, val_accuracy=0.96)  # a fraction
    report.checkpoint(path="checkpoints/last.pt", epoch=epoch)

ddp-worker starts each rank of a command job with DDP_EVENTS_FD naming an inherited
pipe. Every call writes one JSON object and a newline to it, under a lock, so lines from
the threads of one process never interleave; across processes (DataLoader workers that
report too) a line is written whole only up to PIPE_BUF (4096 bytes), as for any pipe:

    {"type": "step", "loss": 0.42, "epoch": 0, "step": 3, "steps": 28, "time": 1718000000.5}

  step:        loss (required, a number); epoch, step (0-based within the epoch), steps (per
               epoch), global_step (integers); samples_per_s, step_ms, comm_ms, lr,
               gpu_memory_allocated_mib, gpu_memory_reserved_mib, gpu_memory_peak_mib
               (numbers; gpu_memory() fills the last three on a GPU)
  epoch:       epoch (integer); train_loss, val_loss, val_accuracy (numbers, 0..1 for accuracy)
  checkpoint:  path (a string); epoch, step, global_step (integers)

Every line also carries "time" (Unix seconds, float) unless the call passes its own.
Values may be Python numbers or NumPy/torch scalars (read through .item()); NaN and
infinities are written as null, and so is a number that cannot be converted. A field
left out or passed as None is omitted. Keyword arguments not listed above are passed
through as they are (the receiver ignores fields it does not know), so a program may add
its own. Reporting never raises: a line over 64 KiB is dropped, and once the pipe is
gone (EPIPE, a closed descriptor) reporting turns itself off and training carries on.

Without DDP_EVENTS_FD (plain python, torchrun) every call is a silent no-op, so the same
script runs anywhere; with DDP_REPORT_STDOUT=1 the lines go to stdout instead.

The checkpoint-now notice: when the job is about to move (a drain, a higher-priority
job, its worker stopping on SIGTERM), ddp-worker writes it to the file named by
DDP_NOTICE_FILE. notice() returns it (or None); should_checkpoint() is True once per new
notice, so a program checkpoints at once instead of at its next periodic boundary and
then reports it with checkpoint(), after which ddp moves the job:

    if report.should_checkpoint():      # every rank must agree: see docs/command-jobs.md
        save(...); report.checkpoint(path=..., global_step=step)

DDP_STOP_GRACE_S is how long a stopping worker gives its ranks after the notice.
"""

import json
import math
import os
import sys
import threading
import time

__all__ = ["enabled", "step", "epoch", "checkpoint", "notice", "should_checkpoint",
           "gpu_memory"]

_INT_FIELDS = frozenset(("epoch", "step", "steps", "global_step"))
_NUM_FIELDS = frozenset(("loss", "samples_per_s", "step_ms", "comm_ms", "lr",
                         "gpu_memory_allocated_mib", "gpu_memory_reserved_mib",
                         "gpu_memory_peak_mib",
                         "train_loss", "val_loss", "val_accuracy", "time"))
_MAX_LINE = 64 * 1024
_UNSET = object()
_STDOUT = "stdout"
_sink = _UNSET  # A descriptor, _STDOUT, or None (off); resolved at the first call.
_lock = threading.Lock()  # One line at a time from this process's threads.


def _resolve():
    global _sink
    if _sink is _UNSET:
        fd = os.environ.get("DDP_EVENTS_FD", "").strip()
        if fd:
            _sink = int(fd) if fd.isdigit() else None
        else:
            _sink = _STDOUT if os.environ.get("DDP_REPORT_STDOUT") == "1" else None
    return _sink


def enabled():
    """Whether calls write anything (DDP_EVENTS_FD set, or DDP_REPORT_STDOUT=1, pipe open)."""
    return _resolve() is not None


def _scalar(v):
    item = getattr(v, "item", None)  # torch.Tensor, numpy scalars and 0-d arrays
    return item() if callable(item) else v


def _number(v):
    try:
        v = float(_scalar(v))
    except (TypeError, ValueError, RuntimeError):
        return None
    return v if math.isfinite(v) else None


def _plain(v):
    """A value JSON can hold, NaN and infinities as null (for pass-through fields)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if not isinstance(v, (str, bool, int, float, type(None))):
        try:
            v = _scalar(v)
        except (TypeError, ValueError, RuntimeError):
            return str(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return v  # Anything else JSON cannot hold is written as str(v).


def _emit(kind, fields):
    global _sink
    sink = _resolve()
    if sink is None:
        return
    line = {"type": kind}
    for key, value in fields.items():
        if value is None or key == "type":
            continue
        if key in _INT_FIELDS:
            try:
                line[key] = int(_scalar(value))
            except (TypeError, ValueError, OverflowError, RuntimeError):
                pass  # An integer field that is not one (NaN) is left out: never malformed.
        elif key in _NUM_FIELDS:
            line[key] = _number(value)
        elif key == "path":
            line[key] = str(value)  # str or pathlib.Path
        else:
            line[key] = _plain(value)
    if line.get("time") is None:
        line["time"] = time.time()
    try:
        data = (json.dumps(line, allow_nan=False, default=str) + "\n").encode("utf-8")
    except (TypeError, ValueError):
        return
    if len(data) > _MAX_LINE:
        return
    with _lock:
        try:
            if sink is _STDOUT:
                sys.stdout.write(data.decode("utf-8"))
                sys.stdout.flush()
                return
            while data:  # One write: a pipe takes it whole unless a signal cuts it short.
                data = data[os.write(sink, data):]
        except BlockingIOError:
            pass  # A full non-blocking pipe: this line is dropped, training does not wait.
        except (OSError, ValueError):
            _sink = None  # EPIPE, a closed descriptor or stdout: stop reporting, keep training.


def step(loss, **fields):
    """One training step of this rank: loss, and epoch, step, steps, samples_per_s, ..."""
    _emit("step", dict(loss=loss, **fields))


def gpu_memory(device=None):
    """This process's CUDA memory in MiB as step() fields (torch.cuda.memory_allocated,
    memory_reserved, max_memory_allocated), or {} without torch or a GPU in use:
    ddp_report.step(loss, **ddp_report.gpu_memory())."""
    import sys
    torch = sys.modules.get("torch")  # Never imported here: only if the program has it.
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    mib = 1024.0 * 1024.0
    return {"gpu_memory_allocated_mib": torch.cuda.memory_allocated(device) / mib,
            "gpu_memory_reserved_mib": torch.cuda.memory_reserved(device) / mib,
            "gpu_memory_peak_mib": torch.cuda.max_memory_allocated(device) / mib}


def epoch(epoch=None, **fields):
    """The end of an epoch: train_loss, val_loss, val_accuracy (a fraction, 0..1)."""
    _emit("epoch", dict(epoch=epoch, **fields))


def checkpoint(path=None, **fields):
    """A checkpoint was written (path, epoch, step, global_step)."""
    _emit("checkpoint", dict(path=path, **fields))


_notice_seen = 0  # The newest notice should_checkpoint() returned True for.


def notice():
    """The newest checkpoint-now notice as (seq, deadline_unix_s or None, reason), or None."""
    path = os.environ.get("DDP_NOTICE_FILE")
    if not path:
        return None
    try:
        with open(path) as f:
            parts = f.readline().rstrip("\n").split(" ", 2)
        seq, deadline_ms = int(parts[0]), int(parts[1])
    except (OSError, ValueError, IndexError):
        return None
    if seq <= 0:
        return None
    return (seq, deadline_ms / 1000.0 if deadline_ms > 0 else None,
            parts[2] if len(parts) > 2 else "")


def should_checkpoint():
    """True once for each new notice: checkpoint now (then report it with checkpoint())."""
    global _notice_seen
    n = notice()
    if n is None or n[0] <= _notice_seen:
        return False
    _notice_seen = n[0]
    return True
