"""llmtasks, the service: what the Lambda functions run (the layer carries this package whole).

The SDK is its own distribution (`llmtasks-client`, imported as `llmtasks_client`), and so are
the local tools (`llmtasks-local`: the emulator, the mock LLM, the CLI); this package imports
neither.
"""

# The service's release (semantic versioning, CHANGELOG.md): /health answers it. The
# distribution's version is read from here (pyproject.toml), so the two cannot differ.
__version__ = "0.2.0"
