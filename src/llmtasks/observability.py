"""The single logger and tracer every module uses (Powertools).

Log lines carry keys (`task_id`, `tenant_id`, ...), never the prompt, the result or a key.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Tracer

SERVICE = "llmtasks"

logger = Logger(service=SERVICE)
tracer = Tracer(service=SERVICE)
