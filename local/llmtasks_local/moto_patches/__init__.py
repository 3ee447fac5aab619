"""moto made to behave as AWS where llmtasks depends on it, and fast where it was slow.

moto is the AWS of every local run: the unit tests' in-process moto, `llmtasks invoke`'s and the
local stack's moto server. Each module patches one behaviour in which moto differs from AWS, and
each is checked against a real endpoint's behaviour by tests/integration/test_aws_conformance.py:

- `atomic`: a conditional write is checked and applied as one step, as DynamoDB does (moto
  applies an UpdateItem's clauses one by one, so two writers could both pass a condition);
- `fair_queues`: a standard queue hands out the messages of quiet tenants (MessageGroupId) first,
  as SQS fair queues do;
- `redrive`: SQS's message move tasks (StartMessageMoveTask and friends), which moto lacks;
- `bedrock_batch`: Bedrock's batch inference jobs (CreateModelInvocationJob and friends), which
  moto lacks, run against moto's S3 with the mock LLM's answers;
- `queue_index`: an SQS queue's receives and deletes find their messages without scanning it;
- `fast_paths`: moto's replies and expressions computed the same way at a fraction of the cost
  (tests/unit/test_fast_paths.py); with them `index_queries`, a Query on an index that reads
  only the items of its key;
- `ttl_index`: each TTL table's items by their TTL value, kept as they are written, so that the
  local stack's TTL sweep reads what has expired, not every item;
- `serving`: the moto server's request loop (werkzeug, http.client, Flask) made lighter.

Every patch replaces private code of moto (or of werkzeug and http.client beneath it), so each
was written for one moto version: CHECKED_WITH, the version local/pyproject.toml pins. `enabled()`
is the gate every patch goes through: on any other moto version, or with the environment
variable LLMTASKS_MOTO_PATCHES=off, no patch is installed and moto runs as released, with one
line on stderr saying so. Stock moto is slower and lacks the move tasks and the fair queues; the
local stack keeps DynamoDB's conditional writes and SQS's receives atomic without the patches by
serving those requests one at a time (emulator/moto_stock.py), and its journal follows moto's
backend operations on any version that has them (emulator/moto_state.py): slower, never wrong.

Nothing here is of the local stack's runtime (`llmtasks_local.emulator`), and none of it ships to Lambda.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

# The moto version every patch here (and the journal's hooks, emulator/moto_state.py) was
# written for and tested with; local/pyproject.toml pins the same.
CHECKED_WITH = "5.2.6"
# "off" keeps every patch out, whatever the version (the tests of stock moto set it).
SWITCH = "LLMTASKS_MOTO_PATCHES"

_said: list[str] = []


def refusal() -> str | None:
    """Why the patches are not installed in this process, or None when they are allowed."""
    if os.environ.get(SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return f"{SWITCH}=off"
    import moto

    found = getattr(moto, "__version__", "unknown")
    if found != CHECKED_WITH:
        return f"moto {found} found, the patches were checked with moto {CHECKED_WITH}"
    return None


def stock_line(reason: str) -> str:
    """The one line that says the patches are off, and why."""
    return f"moto patches off ({reason}): running on stock moto: slower, never wrong"


def enabled() -> bool:
    """Whether the patches may be installed; says once a process why not, in one line."""
    reason = refusal()
    if reason is not None and not _said:
        _said.append(reason)
        print(stock_line(reason), file=sys.stderr, flush=True)
    return reason is None


def install(beneath_fair_queues: Callable[[], None] | None = None) -> bool:
    """Every patch, in the order they build on each other, when enabled(); idempotent, before
    moto serves. Returns whether they are installed. `beneath_fair_queues` goes in after the
    writes and indexes and before the fair queue's bookkeeping (the moto server's journal: it
    records the atomic writes, so replays take the same locks and keep the indexes)."""
    if not enabled():
        return False
    from llmtasks_local.moto_patches import (
        atomic,
        bedrock_batch,
        fair_queues,
        fast_paths,
        queue_index,
        redrive,
        ttl_index,
    )

    redrive.install()
    bedrock_batch.install()
    atomic.install()
    queue_index.install()
    ttl_index.install()
    if beneath_fair_queues is not None:
        beneath_fair_queues()
    fair_queues.install()
    fast_paths.install()
    return True
