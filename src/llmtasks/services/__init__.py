"""The use cases: submit, read and cancel tasks and batches, fan batches out and count them,
relay and deliver webhooks."""
