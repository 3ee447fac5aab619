"""AuthorizerFunction's parts: the API keys, nothing else."""

from __future__ import annotations

from functools import lru_cache

from llmtasks.aws.apikeys import ApiKeys
from llmtasks.settings import AuthorizerResources, resources
from llmtasks.wiring import build_in_lambda, check_configuration
from llmtasks.wiring.adapters import dynamodb


def cold_start() -> None:
    check_configuration(AuthorizerResources)
    build_in_lambda(api_keys)


@lru_cache(maxsize=1)
def api_keys() -> ApiKeys:
    return ApiKeys(resources(AuthorizerResources).api_keys_table_name, dynamodb())
