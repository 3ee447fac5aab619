"""AuthorizerFunction: the HTTP API's Lambda authorizer (payload 2.0, simple responses).

It lets every request through with its verdict in the context: the tenant of a valid key, or
why there is none. The function behind the route turns a refusal into a 401 problem+json,
which an HTTP API cannot do for an authorizer's own refusal (that is a bare 403).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import (
    APIGatewayAuthorizerEventV2,
    APIGatewayAuthorizerResponseV2,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks import wiring
from llmtasks.apikeys import CachedAuthenticator, presented_key
from llmtasks.observability import logger


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP, clear_state=True)
def lambda_handler(
    event: dict[str, Any], context: LambdaContext, authenticator: CachedAuthenticator | None = None
) -> dict[str, Any]:
    request = APIGatewayAuthorizerEventV2(event)
    decision = (authenticator or wiring.authenticator()).authenticate(presented_key(request.headers or {}))
    verdict = {"tenant_id": decision.tenant_id} if decision.tenant_id else {"refusal": decision.refusal}
    logger.info("authorized" if decision.tenant_id else "refused", route=request.route_arn, **verdict)
    return APIGatewayAuthorizerResponseV2(authorize=True, context=verdict).asdict()
