"""Operator tools for a developer's machine (the CLI's dlq, stats and keys); not in the Lambda layer."""
