"""moto made to behave as AWS where llmtasks depends on it, and fast where it was slow.

moto is the AWS of every local run: the unit tests' in-process moto, `llmtasks invoke`'s and the
local stack's moto server. Each module patches one behaviour in which moto differs from AWS, and
each is checked against a real endpoint's behaviour by tests/integration/test_aws_conformance.py:

- `atomic`: a conditional write is checked and applied as one step, as DynamoDB does (moto
  applies an UpdateItem's clauses one by one, so two writers could both pass a condition);
- `fair_queues`: a standard queue hands out the messages of quiet tenants (MessageGroupId) first,
  as SQS fair queues do;
- `redrive`: SQS's message move tasks (StartMessageMoveTask and friends), which moto lacks;
- `queue_index`: an SQS queue's receives and deletes find their messages without scanning it;
- `fast_paths`: the replies and expressions that profiles of the local stack found dominating
  moto's CPU, computed the same way at a fraction of the cost (tests/unit/test_fast_paths.py);
  with them `index_queries`, a Query on an index that reads only the items of its key.

Nothing here is of the local stack's runtime (`llmtasks_local.emulator`), and none of it ships to Lambda.
"""

from __future__ import annotations


def install() -> None:
    """Every patch, in the order they build on each other; idempotent, before moto serves."""
    from llmtasks_local.moto_patches import atomic, fair_queues, fast_paths, queue_index, redrive

    redrive.install()
    atomic.install()
    queue_index.install()
    fair_queues.install()
    fast_paths.install()
