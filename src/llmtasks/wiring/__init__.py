"""Builds the real collaborators from the configuration and the resources, once per process (a
Lambda sandbox): a module for each function, which imports only that function's parts, and the
adapters several of them share (`adapters`).

Each handler module calls its wiring's `cold_start` when it is imported: the function's resource
model and the settings sections its parts read are checked then. Handlers take each collaborator
as an optional argument and fall back to these, so tests pass their own without monkeypatching.
"""

from __future__ import annotations

from llmtasks.settings import FunctionResources, SettingsSection, resources, section


def check_configuration(function: type[FunctionResources], *sections: type[SettingsSection]) -> None:
    """Validates a function's resources and the sections its parts read, as its handler module
    is imported: a missing or bad variable fails the cold start (settings.MissingConfiguration),
    naming it."""
    resources(function)
    for model in sections:
        section(model)
