"""Fixtures the unit suites share beyond tests/conftest.py."""

from tests.unit.test_worker import worker  # noqa: F401 - the worker of test_worker.py, for other suites
