"""The mock LLM: an OpenAI Chat Completions server in miniature (server.py), which reads a
request as OpenAI does (request.py) and answers in OpenAI's shapes (reply.py, schema.py)."""

from llmtasks_local.mock_llm.reply import reply_text
from llmtasks_local.mock_llm.server import MockConfig, MockLLM, MockStats, serve

__all__ = ["MockConfig", "MockLLM", "MockStats", "reply_text", "serve"]
