"""The Python client of ddp's coordinator (docs/python-client.md).

    from ddp_client import Client
    c = Client()                       # $DDP_COORDINATOR, $DDP_TLS_CA, $DDP_TOKEN
    job_id = c.submit("examples/cancer.yaml")
    job = c.wait(job_id)               # {"id": ..., "state": "SUCCEEDED", ...}
"""
from .client import TERMINAL_STATES, Client, parse_coordinators
from .convert import message_to_dict, to_frame
from .errors import (AlreadyExists, DdpError, DeadlineExceeded, FailedPrecondition,
                     InvalidSpec, NotFound, PermissionDenied, ResourceExhausted,
                     Unauthenticated, Unavailable, WaitTimeout)

__version__ = "0.1.0"

__all__ = [
    "Client", "TERMINAL_STATES", "parse_coordinators", "message_to_dict", "to_frame",
    "DdpError", "InvalidSpec", "NotFound", "AlreadyExists", "FailedPrecondition",
    "PermissionDenied", "Unauthenticated", "ResourceExhausted", "Unavailable",
    "DeadlineExceeded", "WaitTimeout",
]
