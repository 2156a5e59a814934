"""ddp's coordinator from Python: what ddpctl does (submit, wait, watch, get, list,
cancel, logs, workers), answering with plain dicts and lists of dicts.

    from ddp_client import Client
    c = Client()                      # $DDP_COORDINATOR, else 127.0.0.1:29400
    job_id = c.submit("examples/cancer.yaml")
    for update in c.watch(job_id):    # per-rank metric updates
        print(update["rank"], update["global_step"], update["loss"])
    print(c.wait(job_id)["state"])    # "SUCCEEDED"
"""
import ipaddress
import json
import os
import random
import re
import time
from collections.abc import Mapping

import grpc

from .convert import message_to_dict, to_frame
from .errors import DdpError, InvalidSpec, Unavailable, WaitTimeout, from_rpc_error

try:
    from ._proto.ddp.v1 import job_service_pb2 as pb
    from ._proto.ddp.v1 import job_service_pb2_grpc as pb_grpc
    from ._proto.ddp.v1 import types_pb2
except ImportError as e:  # Run from the source tree without building it.
    raise ImportError(
        "ddp_client's gRPC stubs are missing (%s): they are generated when the package is "
        "built; install it with `pip install ./python` from the repository" % e) from e

TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
DEFAULT_COORDINATOR = "127.0.0.1:29400"

# common/rpc/leader.h: how a coordinator in standby refuses a call.
_NOT_LEADER = "not the leader: "
_LEADER_AT = "; the leader is at "
# client/reconnect.cc: a stream that ended so lost the coordinator, not an answer of it.
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
              grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL,
              grpc.StatusCode.DEADLINE_EXCEEDED)
_DRAIN_POLICIES = {"at_checkpoint": types_pb2.DRAIN_AT_CHECKPOINT,
                   "wait": types_pb2.DRAIN_WAIT, "now": types_pb2.DRAIN_NOW}
_WORKER_PAGE = 1000


def parse_coordinators(value):
    """"a:29400,b:29400" -> ["a:29400", "b:29400"] (whitespace trimmed); ValueError naming
    an entry that is not HOST:PORT."""
    out = []
    for part in value.split(","):
        address = part.strip()
        if not address:
            continue
        host, sep, port = address.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("coordinator: '%s' is not HOST:PORT" % address)
        out.append(address)
    if not out:
        raise ValueError("no coordinator address given (HOST:PORT[,HOST:PORT...])")
    return out


def _host_of(address):
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") else host


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(token, where):
    """The coordinator's token syntax (common/auth/tokens.cc): 16-4096 printable ASCII
    characters without spaces."""
    if len(token) < 16:
        raise ValueError("%s: a token must be at least 16 characters "
                         "(scripts/make_certs.sh makes 43)" % where)
    if len(token) > 4096:
        raise ValueError("%s: a token is at most 4096 characters" % where)
    if any(not 0x21 <= ord(c) <= 0x7e for c in token):
        raise ValueError("%s: a token is printable ASCII without spaces or control "
                         "characters" % where)
    return token


def _names_workdir(text):
    """Whether spec text sets the top-level `workdir` (a block key at column 0, or a key
    of a flow/JSON mapping): then that directory is the job's, as with ddpctl."""
    return bool(re.search(r"^[\"']?workdir[\"']?[ \t]*:", text, re.M) or
                re.search(r"[{,][ \t\r\n]*[\"']?workdir[\"']?[ \t]*:", text))


class Client:
    """A connection to the coordinator (or to coordinators in standby: the leader is found
    and followed, as by ddpctl).

    coordinator  "HOST:PORT", or several comma-separated (default: $DDP_COORDINATOR, then
                 127.0.0.1:29400).
    tls_ca       the CA file of the coordinator's certificate: connect with TLS (default:
                 $DDP_TLS_CA). The client presents no certificate.
    token        the token itself; or token_file, a file holding it (default: $DDP_TOKEN).
                 Sent as `authorization: Bearer <token>`; never in plaintext to anything
                 but a loopback address.
    timeout      seconds for each unary call (ddpctl's 15).
    reconnect_for  seconds watch/follow_logs/wait keep reopening a stream after the
                 coordinator went away (ddpctl's 60).
    """

    def __init__(self, coordinator=None, *, tls_ca=None, token=None, token_file=None,
                 timeout=15.0, reconnect_for=60.0):
        coordinator = coordinator or os.environ.get("DDP_COORDINATOR") or DEFAULT_COORDINATOR
        self.coordinators = parse_coordinators(coordinator)
        if tls_ca is None:
            tls_ca = os.environ.get("DDP_TLS_CA") or None
        if token is not None and token_file is not None:
            raise ValueError("give token or token_file, not both")
        if token_file is not None:
            try:
                with open(token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise ValueError("token_file: cannot read token file %s (%s)" %
                                 (token_file, e.strerror)) from None
            check_token(token, "token file %s" % token_file)
        elif token is not None:
            check_token(token, "token")
        elif os.environ.get("DDP_TOKEN"):
            token = check_token(os.environ["DDP_TOKEN"], "DDP_TOKEN")
        self.tls = bool(tls_ca)
        if token and not self.tls:
            for address in self.coordinators:
                if not _is_loopback(_host_of(address)):
                    raise ValueError("refusing to send a token in plaintext to %s: give the "
                                     "coordinator's CA with tls_ca (or DDP_TLS_CA)" % address)
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self.timeout = timeout
        self.reconnect_for = reconnect_for
        options = [("grpc.max_receive_message_length", -1),
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if self.tls:
            try:
                with open(tls_ca, "rb") as f:
                    ca = f.read()
            except OSError as e:
                raise ValueError("tls_ca: cannot read %s (%s)" % (tls_ca, e.strerror)) from None
            creds = grpc.ssl_channel_credentials(root_certificates=ca)
            self._channels = [grpc.secure_channel(a, creds, options=options)
                              for a in self.coordinators]
        else:
            self._channels = [grpc.insecure_channel(a, options=options)
                              for a in self.coordinators]
        self._stubs = [pb_grpc.JobServiceStub(c) for c in self._channels]
        self._at = 0
        self._leader_known = len(self.coordinators) < 2

    # --- connection ------------------------------------------------------------------

    @property
    def coordinator(self):
        """HOST:PORT of the coordinator calls go to (the leader, once found)."""
        return self.coordinators[self._at]

    def close(self):
        for c in self._channels:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _next_coordinator(self, err):
        """Which address to ask after the current one failed with `err`: the leader it
        names when that is one of ours, else the next in order."""
        message = err.details() or ""
        if message.startswith(_NOT_LEADER) and _LEADER_AT in message:
            leader = message.rsplit(_LEADER_AT, 1)[1].strip()
            if leader in self.coordinators:
                return self.coordinators.index(leader)
        return (self._at + 1) % len(self.coordinators)

    def _follow_leader(self):
        """With several coordinators: points calls at the one that leads (any answer but
        UNAVAILABLE or a deadline is the leader's: an empty job id is refused without a
        lookup); leaves them as they are when none answers."""
        if len(self.coordinators) < 2:
            return
        at = self._at
        for _ in range(2 * len(self.coordinators)):
            try:
                self._stubs[at].GetJob(pb.GetJobRequest(), timeout=2.0, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._at = at
                    at = self._next_coordinator(e)
                    continue
            self._at = at
            self._leader_known = True
            return

    def _error(self, err):
        return from_rpc_error(err, self.coordinator)

    def _unary(self, method, request, timeout=None):
        if not self._leader_known:
            self._follow_leader()
        for attempt in range(2 * len(self.coordinators)):
            try:
                return getattr(self._stubs[self._at], method)(
                    request, timeout=timeout or self.timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                # A standby refused it without doing anything: safe to ask the leader.
                if (len(self.coordinators) > 1 and e.code() == grpc.StatusCode.UNAVAILABLE and
                        (e.details() or "").startswith(_NOT_LEADER) and
                        attempt + 1 < 2 * len(self.coordinators)):
                    self._at = self._next_coordinator(e)
                    continue
                raise self._error(e) from None
        raise AssertionError("unreachable")

    def _stream(self, method, request, on_message, timeout=None):
        """Reads a server stream, calling on_message(msg) -> new request or None; reopens
        it (with the request on_message last returned) after a transient failure once the
        coordinator has answered, for up to reconnect_for seconds (ddpctl's rule)."""
        if not self._leader_known:
            self._follow_leader()
        deadline = None if timeout is None else time.monotonic() + timeout
        reached = False
        outage_since = None
        backoff = 0.1
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            call = getattr(self._stubs[self._at], method)(request, timeout=remaining,
                                                          metadata=self._metadata)
            try:
                for msg in call:
                    reached = True
                    outage_since = None
                    backoff = 0.1
                    yield msg
                    next_request = on_message(msg)
                    if next_request is not None:
                        request = next_request
                return
            except grpc.RpcError as e:
                code = e.code()
                if deadline is not None and time.monotonic() >= deadline and \
                        code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise WaitTimeout("no end of the stream within %gs" % timeout,
                                      code=code, coordinator=self.coordinator) from None
                if not reached or code not in _TRANSIENT:
                    raise self._error(e) from None
                now = time.monotonic()
                outage_since = outage_since or now
                if now - outage_since > self.reconnect_for:
                    raise Unavailable(
                        "lost the coordinator at %s: no answer for %gs (%s); the job itself "
                        "carries on" % (self.coordinator, self.reconnect_for, e.details()),
                        code=code, coordinator=self.coordinator) from None
                time.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(2.0, backoff * 2)
                self._leader_known = len(self.coordinators) < 2
                if not self._leader_known:
                    self._follow_leader()
            finally:
                call.cancel()

    # --- jobs --------------------------------------------------------------------------

    def submit(self, spec, *, workdir=None, source_name=None):
        """Validates and queues a job; returns its id.

        spec: a dict (sent as JSON text, which the coordinator's YAML parser reads), a
        YAML string, or a job file (a pathlib.Path, or a str naming an existing file on
        one line). Relative paths in the job resolve against `workdir` (absolute), else
        the spec's own `workdir`, else the file's directory (as ddpctl), else the current
        directory. Raises InvalidSpec with the coordinator's message (field and line)."""
        if isinstance(spec, Mapping):
            text = json.dumps(spec, indent=2, ensure_ascii=False)
            source = source_name or "job (dict)"
            own_workdir = "workdir" in spec
            base = os.getcwd()
        elif isinstance(spec, os.PathLike) or (
                isinstance(spec, str) and "\n" not in spec and os.path.isfile(spec)):
            path = os.fspath(spec)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            source = source_name or path
            own_workdir = _names_workdir(text)
            base = os.path.dirname(os.path.abspath(path))
        elif isinstance(spec, (str, bytes)):
            text = spec.decode("utf-8") if isinstance(spec, bytes) else spec
            source = source_name or "job.yaml (string)"
            own_workdir = _names_workdir(text)
            base = os.getcwd()
        else:
            raise TypeError("spec must be a dict, a YAML string or a path, not %s" %
                            type(spec).__name__)
        if workdir is not None:
            if not os.path.isabs(workdir):
                raise ValueError("workdir must be an absolute path (got %r)" % workdir)
        elif not own_workdir:
            workdir = os.path.normpath(base)
        request = pb.SubmitJobRequest(spec_yaml=text, workdir=workdir or "",
                                      source_name=source)
        return self._unary("SubmitJob", request).job_id

    def get(self, job_id, *, history=False):
        """The job as a dict: state, reason, attempts with their rank tables, latest
        metrics per rank, epoch history; with history=True also every stored step of
        every rank under "history"."""
        return message_to_dict(self._unary(
            "GetJob", pb.GetJobRequest(job_id=job_id, metric_history=history)))

    def metrics(self, job_id):
        """Every stored step metric of every rank and attempt: a list of dicts (rank,
        attempt, epoch, step, steps, global_step, loss, samples_per_s, step_ms, comm_ms,
        update_ms), in the coordinator's order."""
        return self.get(job_id, history=True)["history"]

    def metrics_frame(self, job_id):
        """metrics() as a pandas DataFrame (ImportError without pandas)."""
        return to_frame(self.metrics(job_id))

    def epochs(self, job_id):
        """Each epoch's summary (rank 0's reduced train/val loss, accuracy, time)."""
        return self.get(job_id)["epoch_history"]

    def list(self, limit=100):
        """Jobs, newest first, without spec, metrics or epoch history."""
        return [message_to_dict(j) for j in
                self._unary("ListJobs", pb.ListJobsRequest(limit=limit)).jobs]

    def cancel(self, job_id, *, wait=True, timeout=60.0):
        """Cancels a job (CANCELLED at once) and, with wait, polls until its workers
        report every trainer stopped (at most `timeout` s, as ddpctl cancel). Returns the
        job. Raises FailedPrecondition for a job that already finished."""
        job = self._unary("CancelJob", pb.CancelJobRequest(job_id=job_id))
        deadline = time.monotonic() + timeout
        while wait and any(a.live_trainers > 0 for a in job.attempts) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
            job = self._unary("GetJob", pb.GetJobRequest(job_id=job_id))
        return message_to_dict(job)

    def watch_jobs(self, job_id, *, timeout=None):
        """The job as a dict at every change until it ends (the first is its full state;
        a slow reader gets the latest, never a backlog)."""
        for msg in self._stream("WatchJob", pb.WatchJobRequest(job_id=job_id),
                                lambda m: None, timeout=timeout):
            yield message_to_dict(msg)

    def watch(self, job_id, *, timeout=None):
        """Per-rank metric updates until the job ends: for every rank whose latest metrics
        changed, a dict of them (rank, attempt, epoch, step, steps, global_step, loss,
        samples_per_s, step_ms, comm_ms, update_ms, gpu_memory_*) with the job's
        "job_id" and "state" added. Updates are the coordinator's latest per rank, so
        steps between two reads may be skipped; metrics() has every stored step."""
        seen = {}
        for job in self.watch_jobs(job_id, timeout=timeout):
            for m in job["metrics"]:
                key = (m["attempt"], m["global_step"], m["update_ms"])
                if seen.get(m["rank"]) == key:
                    continue
                seen[m["rank"]] = key
                update = dict(m)
                update["job_id"] = job["id"]
                update["state"] = job["state"]
                yield update

    def wait(self, job_id, *, timeout=None):
        """Blocks until the job ends; returns it (check its "state": SUCCEEDED, FAILED or
        CANCELLED). Raises WaitTimeout after `timeout` seconds."""
        last = None
        for job in self.watch_jobs(job_id, timeout=timeout):
            last = job
            if job["state"] in TERMINAL_STATES:
                return job
        if last is None or last["state"] not in TERMINAL_STATES:
            last = self.get(job_id)
        return last

    def logs(self, job_id, *, rank=None, tail=0):
        """The job's stored output lines: a list of dicts (seq, attempt, rank, stream,
        text, time_ms); rank: only that rank's; tail: only the last N."""
        return list(self._logs(job_id, False, rank, tail))

    def follow_logs(self, job_id, *, rank=None, tail=0):
        """The stored lines, then new ones as they come, until the job ends (an
        iterator; reconnects as watch does)."""
        return self._logs(job_id, True, rank, tail)

    def _logs(self, job_id, follow, rank, tail):
        request = pb.StreamLogsRequest(job_id=job_id, follow=follow, tail=tail)
        if rank is not None:
            request.has_rank = True
            request.rank = rank
        state = {"after": 0}

        def resume(batch):
            if batch.lines:
                state["after"] = batch.lines[-1].seq
            again = pb.StreamLogsRequest()
            again.CopyFrom(request)
            again.after_seq = state["after"]
            again.tail = 0  # Resume after the last line seen, not from the tail again.
            return again

        for batch in self._stream("StreamLogs", request, resume):
            for line in batch.lines:
                yield message_to_dict(line)

    # --- workers -----------------------------------------------------------------------

    def workers(self, limit=0):
        """Every worker in name order (following the coordinator's pages), or the first
        `limit`: a list of dicts (name, address, slots, free_slots, alive, jobs,
        version, labels, maintenance, ...)."""
        out = []
        token = ""
        while True:
            page_size = _WORKER_PAGE if limit <= 0 else min(_WORKER_PAGE, limit - len(out))
            page = self._unary("ListWorkers", pb.ListWorkersRequest(limit=page_size,
                                                                   page_token=token))
            out.extend(message_to_dict(w) for w in page.workers)
            token = page.next_page_token
            if not token or (limit > 0 and len(out) >= limit):
                return out

    def worker_summary(self):
        """The whole cluster at a glance: workers, alive, lost, slots, free_slots,
        busy_workers, lost_events, cordoned, and coordinator_version."""
        page = self._unary("ListWorkers", pb.ListWorkersRequest(summary_only=True))
        summary = message_to_dict(page.summary)
        summary["coordinator_version"] = page.coordinator_version
        return summary

    def cordon(self, worker):
        """The worker takes no new ranks; its trainers keep running (admin). Returns it."""
        return message_to_dict(self._unary("CordonWorker", pb.CordonWorkerRequest(worker=worker)))

    def drain(self, worker, policy="at_checkpoint"):
        """Cordons the worker and moves its jobs elsewhere: policy "at_checkpoint" (after
        each job's next checkpoint), "now", or "wait" (they finish there) (admin)."""
        if policy not in _DRAIN_POLICIES:
            raise ValueError("policy must be one of %s" % ", ".join(_DRAIN_POLICIES))
        return message_to_dict(self._unary(
            "DrainWorker", pb.DrainWorkerRequest(worker=worker, policy=_DRAIN_POLICIES[policy])))

    def uncordon(self, worker):
        """The worker takes new ranks again (ends a cordon or a drain) (admin)."""
        return message_to_dict(self._unary("UncordonWorker",
                                           pb.UncordonWorkerRequest(worker=worker)))

    def remove_worker(self, worker):
        """Forgets a lost worker (admin); FailedPrecondition while it is alive."""
        self._unary("RemoveWorker", pb.RemoveWorkerRequest(worker=worker))


__all__ = ["Client", "DdpError", "InvalidSpec", "TERMINAL_STATES", "parse_coordinators"]
