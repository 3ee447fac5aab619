"""`python -m llmtasks.cli`: the same command as `llmtasks`."""

from llmtasks.cli import main

main()
