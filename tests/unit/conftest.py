"""Fixtures the unit suites share beyond tests/conftest.py."""

from collections.abc import Iterator

import pytest

from llmtasks_local.mock_llm import MockLLM
from tests.helpers import serve
from tests.unit.test_worker import worker  # noqa: F401 - the worker of test_worker.py, for other suites


@pytest.fixture(scope="module")
def mock_server() -> Iterator[tuple[MockLLM, str]]:
    """A mock LLM of the test module's own, on a free port: it, and its OpenAI base URL."""
    mock = MockLLM()
    with serve(mock.app()) as url:
        yield mock, url + "/v1"
