"""The Bedrock provider (Converse), against botocore's Stubber with replies shaped like Bedrock's
documented ones: no request leaves the machine."""

from __future__ import annotations

import asyncio
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from llmtasks.domain.errors import RATE_LIMITED, LLMError
from llmtasks.domain.llm_request import ChatMessage, LLMRequest
from llmtasks.domain.models import TaskStatus
from llmtasks.llm import provider_from_settings
from llmtasks.llm.bedrock import BedrockConverse
from llmtasks.settings import Settings
from tests.helpers import eventually
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def client() -> Any:
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    )


def converse_reply(text: str, *, inputs: int = 12, outputs: int = 30) -> dict[str, Any]:
    """A Converse reply as Bedrock's API reference shows one."""
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": inputs, "outputTokens": outputs, "totalTokens": inputs + outputs},
        "metrics": {"latencyMs": 812},
    }


def test_a_request_becomes_converse_arguments_and_the_reply_a_completion(client: Any) -> None:
    request = LLMRequest(
        messages=[
            ChatMessage(role="user", content="Name a queue."),
            ChatMessage(role="assistant", content="SQS."),
            ChatMessage(role="user", content="Another?"),
        ],
        system="Be brief.",
        max_tokens=64,
        temperature=0.2,
    )
    expected = {
        "modelId": MODEL,
        "system": [{"text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"text": "Name a queue."}]},
            {"role": "assistant", "content": [{"text": "SQS."}]},
            {"role": "user", "content": [{"text": "Another?"}]},
        ],
        "inferenceConfig": {"maxTokens": 64, "temperature": 0.2},
    }
    with Stubber(client) as stub:
        stub.add_response("converse", converse_reply("Kafka."), expected)
        completion = asyncio.run(
            BedrockConverse(default_model=MODEL, client=client).complete(request, timeout_s=5)
        )
        stub.assert_no_pending_responses()
    assert completion.text == "Kafka."
    assert completion.model == MODEL
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (
        12,
        30,
        42,
    )


@pytest.mark.parametrize(
    ("error", "status", "transient", "code"),
    [
        ("ThrottlingException", 429, True, RATE_LIMITED),
        ("ModelNotReadyException", 429, True, RATE_LIMITED),
        ("ModelTimeoutException", 408, True, "llm_http_408"),
        ("InternalServerException", 500, True, "llm_http_500"),
        ("ServiceUnavailableException", 503, True, "llm_http_503"),
        ("ValidationException", 400, False, "llm_http_400"),
        ("AccessDeniedException", 403, False, "llm_http_403"),
        ("ResourceNotFoundException", 404, False, "llm_http_404"),
        ("ModelErrorException", 424, False, "llm_http_424"),
    ],
)
def test_bedrock_errors_are_transient_or_permanent_as_http_errors_are(
    client: Any, error: str, status: int, transient: bool, code: str
) -> None:
    with Stubber(client) as stub:
        stub.add_client_error(
            "converse", service_error_code=error, service_message="no", http_status_code=status
        )
        with pytest.raises(LLMError) as raised:
            asyncio.run(
                BedrockConverse(default_model=MODEL, client=client).complete(
                    LLMRequest(prompt="hi"), timeout_s=5
                )
            )
    assert (raised.value.transient, raised.value.code) == (transient, code)
    assert error in str(raised.value)


def test_a_reply_without_text_fails_the_task(client: Any) -> None:
    reply = converse_reply("")
    reply["output"]["message"]["content"] = [{"toolUse": {"toolUseId": "t1", "name": "x", "input": {}}}]
    with Stubber(client) as stub:
        stub.add_response("converse", reply)
        with pytest.raises(LLMError) as raised:
            asyncio.run(
                BedrockConverse(default_model=MODEL, client=client).complete(
                    LLMRequest(prompt="hi"), timeout_s=5
                )
            )
    assert (raised.value.code, raised.value.transient) == ("llm_invalid_reply", False)


def test_settings_choose_bedrock(settings: Settings) -> None:
    chosen = settings.model_copy(update={"llm_provider": "bedrock", "llm_model": MODEL})
    provider = provider_from_settings(chosen)
    assert isinstance(provider, BedrockConverse)


def test_the_worker_retries_a_throttled_bedrock_call_and_completes_the_task(
    worker: Worker, client: Any
) -> None:
    task_id = worker.submit("Summarise Bedrock in five words")
    bedrock = BedrockConverse(default_model=MODEL, client=client)
    unstreamed = {"progress_interval_s": 0}  # Converse, not ConverseStream
    with Stubber(client) as stub:
        stub.add_client_error("converse", service_error_code="ThrottlingException", http_status_code=429)
        stub.add_response("converse", converse_reply("Managed access to foundation models."))
        assert worker.run_queued(llm=bedrock, **unstreamed) == {"batchItemFailures": []}
        throttled = worker.task(task_id)
        assert (throttled.status, throttled.last_error_code) == (TaskStatus.PENDING, RATE_LIMITED)
        retry = eventually(worker.queued, bool, timeout_s=10, what="the retry's message")
        assert worker.run(retry, llm=bedrock, **unstreamed) == {"batchItemFailures": []}
    done = worker.task(task_id)
    assert (done.status, done.result, done.attempts, done.model) == (
        TaskStatus.COMPLETED,
        "Managed access to foundation models.",
        2,
        MODEL,
    )
