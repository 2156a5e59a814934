"""The client's exceptions: every coordinator error is a DdpError carrying its message."""
import grpc


class DdpError(Exception):
    """A call failed. `code` is the gRPC status code (grpc.StatusCode), `message` the
    coordinator's own message (or gRPC's, when the coordinator was not reached), and
    `coordinator` the HOST:PORT that was called."""

    def __init__(self, message, code=None, coordinator=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.coordinator = coordinator

    def __str__(self):
        name = self.code.name if isinstance(self.code, grpc.StatusCode) else None
        return "%s: %s" % (name, self.message) if name else self.message


class InvalidSpec(DdpError):
    """INVALID_ARGUMENT: the job spec (or a request field) was refused; the message names
    the field and line."""


class NotFound(DdpError):
    """NOT_FOUND: no such job (or worker)."""


class AlreadyExists(DdpError):
    """ALREADY_EXISTS: the rdzv_id is in use by a live job."""


class FailedPrecondition(DdpError):
    """FAILED_PRECONDITION: e.g. cancelling a job that has already finished."""


class PermissionDenied(DdpError):
    """PERMISSION_DENIED: the token's role may not make this call."""


class Unauthenticated(DdpError):
    """UNAUTHENTICATED: no token, or an unknown one, for a coordinator that requires one."""


class ResourceExhausted(DdpError):
    """RESOURCE_EXHAUSTED: a spec over 64 KiB, a full queue, or too many open streams."""


class Unavailable(DdpError):
    """UNAVAILABLE: no coordinator answered (or none that leads), or it could not store
    the change."""


class DeadlineExceeded(DdpError):
    """DEADLINE_EXCEEDED: the coordinator did not answer in time."""


class WaitTimeout(DdpError):
    """Client.wait ran out of its timeout before the job ended."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidSpec,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def from_rpc_error(err, coordinator):
    """The DdpError (subclass by status code) for a grpc.RpcError."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else None
    message = details or str(err)
    return _BY_CODE.get(code, DdpError)(message, code=code, coordinator=coordinator)
