"""moto's backends as a value, in memory: what each unit test's fresh in-process moto starts from
(template.yaml provisioned once a test process instead of once a test), and how a state dir of
the release before (a pickle of them) is read once to be migrated. The state dir itself keeps
AWS-level data (emulator/state_format.py), never these objects."""

from __future__ import annotations

import copyreg
import threading
from typing import Any

# What the local stack keeps: tables and their streams, buckets, queues.
SERVICES = ("dynamodb", "dynamodbstreams", "s3", "sqs")


def backends(name: str) -> Any:
    """moto's backends of one service, by account and region."""
    from moto.backends import get_backend

    return get_backend(name)  # type: ignore[call-overload]


def state() -> dict[str, Any]:
    """The backends of SERVICES by service, account and region, ready to pickle (their locks
    pickle as fresh ones)."""
    _picklable_locks()
    return {
        name: {account: dict(regions) for account, regions in backends(name).items()} for name in SERVICES
    }


def install(saved: dict[str, Any]) -> None:
    """The backends of a state() (pickled, then loaded) in place of moto's own."""
    for name, accounts in saved.items():
        live = backends(name)
        for account, regions in accounts.items():
            for region, backend in regions.items():
                live[account][region] = backend


def _picklable_locks() -> None:
    """moto's SQS queues hold locks; a pickle holds fresh ones in their place."""
    copyreg.pickle(type(threading.RLock()), lambda _: (threading.RLock, ()))
    copyreg.pickle(type(threading.Lock()), lambda _: (threading.Lock, ()))
    copyreg.pickle(threading.Condition, lambda _: (threading.Condition, ()))
