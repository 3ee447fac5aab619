"""`python -m llmtasks_local.cli`: the same command as `llmtasks`."""

from llmtasks_local.cli import main

main()
