"""llmtasks-local: what runs only on a developer's (or an operator's) machine.

- `emulator/`: the local stack (`llmtasks up`, `llmtasks invoke`): the gateway, the sandboxes
  under the Runtime API, the event sources, TTL, the durable state;
- `sam/`: the template read as AWS reads it; `moto_patches/`: moto made to behave as AWS where
  llmtasks depends on it;
- `mock_llm.py`: the OpenAI-compatible mock with fault knobs;
- `cli/` and `ops/`: the `llmtasks` command and the operator commands (keys, DLQs, stats).

It runs the service's own handlers (the `llmtasks` distribution) and talks to the API through
the SDK (`llmtasks-client`). Nothing of it ships to Lambda.
"""

# The local tools' release (semantic versioning, CHANGELOG.md); `llmtasks --version` shows it.
__version__ = "0.2.0"

# How long the local HTTP servers (the stack's API and endpoints, the mock LLM) keep an idle
# connection open: longer than clients keep theirs (httpx and urllib3 reuse a pooled connection
# for 5 s), so the client is the one that closes it. At uvicorn's default (5 s, the same), a
# request sent on a connection as the server closed it met "Server disconnected without sending
# a response" (a loaded run's POST /tasks); API Gateway and LLM APIs keep idle connections open
# far longer.
KEEP_ALIVE_S = 75
