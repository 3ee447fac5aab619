"""The HTTP surfaces: the llmtasks API and the OpenAI-compatible one."""
