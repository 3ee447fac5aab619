"""AuthorizerFunction: the HTTP API's Lambda authorizer (payload 2.0, simple responses).

API Gateway calls it only for a request that carries the identity source (`Authorization`;
without it API Gateway answers 401 itself) and keeps its answer per Authorization value for
ReauthorizeEvery (template.yaml: AuthCacheSeconds). A valid key is allowed, with its tenant, key
id and limits in the context the functions read; anything else is denied (API Gateway's 403).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import (
    APIGatewayAuthorizerEventV2,
    APIGatewayAuthorizerResponseV2,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks.aws.apikeys import ApiKeys, presented_key
from llmtasks.observability import logger
from llmtasks.wiring import authorizer as wiring

# What this function needs, checked as Lambda imports it: a missing variable fails the cold start.
wiring.cold_start()


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP, clear_state=True)
def lambda_handler(
    event: dict[str, Any], context: LambdaContext, keys: ApiKeys | None = None
) -> dict[str, Any]:
    request = APIGatewayAuthorizerEventV2(event)
    decision = (keys or wiring.api_keys()).authenticate(presented_key(request.headers or {}))
    if decision.key is None:
        logger.info("refused", route=request.route_arn, refusal=decision.refusal)
        return APIGatewayAuthorizerResponseV2(authorize=False).asdict()
    key = decision.key
    logger.info("authorized", route=request.route_arn, tenant_id=key.tenant_id, key_id=key.key_id)
    return APIGatewayAuthorizerResponseV2(authorize=True, context=key.authorizer_context()).asdict()
