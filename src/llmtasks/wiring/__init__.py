"""Builds the real collaborators from the configuration and the resources, once per process (a
Lambda sandbox): a module for each function, which imports only that function's parts, and the
adapters several of them share (`adapters`).

Each handler module calls its wiring's `cold_start` when it is imported: the function's resource
model and the settings sections its parts read are checked then, and in a Lambda sandbox its parts
are built (`build_in_lambda`). Handlers take each collaborator as an optional argument and fall
back to these, so tests pass their own without monkeypatching.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from llmtasks.settings import FunctionResources, SettingsSection, resources, section


def check_configuration(function: type[FunctionResources], *sections: type[SettingsSection]) -> None:
    """Validates a function's resources and the sections its parts read, as its handler module
    is imported: a missing or bad variable fails the cold start (settings.MissingConfiguration),
    naming it."""
    resources(function)
    for model in sections:
        section(model)


def build_in_lambda(*parts: Callable[[], object]) -> None:
    """Builds a function's parts (each cached once built) as its handler module is imported in a
    Lambda sandbox: their SDK clients are made in the init phase, as Lambda's guidance has it, so a
    sandbox started ahead (provisioned concurrency; `--warm-containers eager` locally) serves its
    first invocation as fast as its next (built at their first use, they would slow the first
    task of each sandbox). Imported outside
    Lambda (the tests), nothing is built until used. In Lambda: LAMBDA_TASK_ROOT is set, as
    worker.call_slots.run_in_lambda_loop reads it."""
    if os.environ.get("LAMBDA_TASK_ROOT"):
        for build in parts:
            build()
