"""Where a LocalStack is, by LocalStack's own conventions (localstack-client): AWS_ENDPOINT_URL
if set, else LOCALSTACK_HOST (host:port, default localhost:4566) with USE_SSL for https.

`--endpoint-url localstack` (or `sqs=localstack`) on `llmtasks up` and `llmtasks invoke`, and the
operator commands' default endpoint, resolve through here. Its default port is also the one
`llmtasks up` serves its embedded moto on, so without any setting both mean this machine's
4566. "localhost" is read as 127.0.0.1: nothing here may leave this machine's loopback by name.
"""

from __future__ import annotations

LOCALSTACK = "localstack"  # the keyword that --endpoint-url resolves


def localstack_endpoint(service: str) -> str:
    """The endpoint of `service` on the LocalStack the environment names."""
    # Imported here: localstack-client imports boto3 (costly), which the commands that
    # import this module (the mock LLM's among them) need only when the keyword is given.
    from localstack_client.config import get_service_endpoint

    endpoint = get_service_endpoint(service)
    if endpoint is None:
        raise ValueError(f"localstack-client knows no endpoint for {service!r}")
    return str(endpoint).replace("://localhost:", "://127.0.0.1:")


def resolved(endpoint: str, service: str) -> str:
    """An --endpoint-url value as a URL: the keyword `localstack` becomes the LocalStack's."""
    return localstack_endpoint(service) if endpoint == LOCALSTACK else endpoint
