"""llmtasks: long LLM calls run asynchronously on AWS serverless."""

__version__ = "0.1.0"
