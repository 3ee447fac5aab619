"""Every AWS client of the process, made from one boto3 session under one lock.

A session's loader keeps what it has read of botocore's data (the list of services, the
endpoints and partitions, each service's model), so a sandbox's second and third clients cost
a fraction of its first (the cold start of every function makes two or three). A session must not make
clients in two threads at once, and a worker makes its S3 client in whichever thread first
needs it: every client is made here, under the lock. Clients are thread-safe once made.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import boto3
from botocore.config import Config

_lock = threading.Lock()


@functools.cache
def _session() -> boto3.session.Session:
    """Made with the first client, from the environment then (the function's, in Lambda)."""
    return boto3.session.Session()


def new_client(service: str, config: Config | None = None) -> Any:
    """A new client of `service` (its type is the caller's to name, as boto3's stubs do)."""
    with _lock:
        return _session().client(service, config=config)  # type: ignore[call-overload]
