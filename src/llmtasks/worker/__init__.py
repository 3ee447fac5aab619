"""WorkerFunction's work: one message's run, and an invocation's call slots kept full."""
