"""A task as OpenAI's objects: the Response (`resp_<task id>`: GET /v1/responses/{id}, the
snapshots its events carry, a responses batch's output lines) and the chat.completion (a chat
batch's output lines).

A Response's `output` is OpenAI's: a `reasoning` item where the provider gave a summary, the
`message` (output_text, or a refusal part; absent when the model only called tools) and a
`function_call` item per tool call. The request's fields come back in OpenAI's names. An answer
cut at max_output_tokens (finish_reason length) or by the content filter is `incomplete`. A run
waiting for its client's function outputs (requires_action) is `completed` with a function_call
item per call to answer, as OpenAI's response that called functions is. A completed run with MCP
servers gives, before its answer, an `mcp_list_tools` item per server listed and an `mcp_call`
item per call of their tools, in step order, as OpenAI's response with remote MCP tools does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmtasks.api.openai_inputs import flat_mcp_tool, flat_tool, flat_tool_choice, text_config
from llmtasks.domain.errors import RATE_LIMITED
from llmtasks.domain.events import INCOMPLETE_REASONS, response_id
from llmtasks.domain.llm_request import ToolCall
from llmtasks.domain.mcp_servers import DENIED, McpApprovalRequest
from llmtasks.domain.models import Task, TaskStatus, Usage
from llmtasks.domain.steps import RunStep, is_tool_error

_STATUSES = {
    TaskStatus.PENDING: "queued",
    TaskStatus.PROCESSING: "in_progress",
    # A run waiting for its client's function outputs: OpenAI's response that called functions
    # has completed (with function_call items); the outputs continue it (previous_response_id).
    TaskStatus.REQUIRES_ACTION: "completed",
    TaskStatus.COMPLETED: "completed",
    TaskStatus.FAILED: "failed",
    TaskStatus.CANCELLED: "cancelled",
}
# A task's error codes that OpenAI has a code of its own for (others are server_error).
_ERROR_CODES = {RATE_LIMITED: "rate_limit_exceeded", "llm_http_400": "invalid_prompt"}


def incomplete_reason(task: Task) -> str | None:
    if task.status is not TaskStatus.COMPLETED:
        return None
    return INCOMPLETE_REASONS.get(task.finish_reason or "")


def response_status(task: Task) -> str:
    return "incomplete" if incomplete_reason(task) else _STATUSES[task.status]


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def refusal_part(refusal: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": refusal}


def message_item(
    task_id: str, parts: list[dict[str, Any]] | None, status: str = "completed"
) -> dict[str, Any]:
    """The response's message: in progress and empty (None), or ended with its parts."""
    return {
        "type": "message",
        "id": f"msg_{task_id}",
        "status": "in_progress" if parts is None else status,
        "role": "assistant",
        "content": parts or [],
    }


def message_parts(task: Task) -> list[dict[str, Any]]:
    """The message's content: its text (possibly empty), or its refusal."""
    parts = [text_part(task.result)] if task.result else []
    if task.refusal is not None:
        parts.append(refusal_part(task.refusal))
    return parts or [text_part("")]


def has_message(task: Task) -> bool:
    """Whether the answer has a message item: text, a refusal, or at least no tool calls."""
    return bool(task.result or task.refusal is not None or not task.tool_calls)


def reasoning_item(task_id: str, summary: str | None) -> dict[str, Any]:
    """The reasoning item: its summary as one part (None: in progress, no part yet)."""
    return {
        "type": "reasoning",
        "id": f"rs_{task_id}",
        "summary": [] if summary is None else [{"type": "summary_text", "text": summary}],
        "status": "in_progress" if summary is None else "completed",
    }


def function_call_item(
    task_id: str, index: int, call: ToolCall, arguments: str | None = None, *, step: int | None = None
) -> dict[str, Any]:
    """A tool call as OpenAI's function_call item (`arguments` given: in progress so far); a
    run's call to answer is named by the model step that asked for it too (`step`)."""
    return {
        "type": "function_call",
        "id": f"fc_{task_id}_{index}" if step is None else f"fc_{task_id}_{step}_{index}",
        "call_id": call.id,
        "name": call.function.name,
        "arguments": call.function.arguments if arguments is None else arguments,
        "status": "completed" if arguments is None else "in_progress",
    }


def waiting_items(
    task_id: str, step: int, calls: list[ToolCall], approvals: Sequence[McpApprovalRequest] = ()
) -> list[dict[str, Any]]:
    """What a run waits for (asked by model step `step`): the calls to answer as function_call
    items, then the MCP calls to approve as mcp_approval_request items (answered by their id)."""
    items = [function_call_item(task_id, index, call, step=step) for index, call in enumerate(calls)]
    return items + [request.model_dump(mode="json") for request in approvals]


def mcp_items(task_id: str, steps: Sequence[RunStep]) -> list[dict[str, Any]]:
    """A run's MCP steps as OpenAI's items: each server's list (mcp_list_tools), then each call
    of its tools (mcp_call, by the server's name of the tool), in step order."""
    names: dict[str, str] = {}  # the function the model called: the server's tool
    items: list[dict[str, Any]] = []
    for step in steps:
        if step.type == "mcp_list_tools":
            tools = step.tools or []
            names |= {tool.function_name: tool.name for tool in tools}
            items.append(
                {
                    "type": "mcp_list_tools",
                    "id": f"mcpl_{task_id}_{step.step}",
                    "server_label": step.server_label or "",
                    "tools": [
                        {
                            "name": tool.name,
                            "description": tool.description,
                            "input_schema": tool.input_schema,
                            "annotations": None
                            if tool.read_only is None
                            else {"read_only_hint": tool.read_only},
                        }
                        for tool in tools
                    ],
                    "error": None,
                }
            )
        elif step.type == "tool_call" and step.source == "mcp" and step.tool_call is not None:
            call = step.tool_call.function
            output = step.output or ""
            failed = is_tool_error(step) or output.startswith(DENIED)
            items.append(
                {
                    "type": "mcp_call",
                    "id": f"mcp_{task_id}_{step.step}",
                    "server_label": step.server_label or "",
                    "name": names.get(call.name, call.name),
                    "arguments": call.arguments,
                    "output": None if failed else output,
                    "error": {
                        "type": "mcp_tool_execution_error",
                        "content": [{"type": "text", "text": output}],
                    }
                    if failed
                    else None,
                    "status": "failed" if failed else "completed",
                    "approval_request_id": None,
                }
            )
    return items


def output_items(task: Task, steps: Sequence[RunStep] = ()) -> list[dict[str, Any]]:
    """The response's output: a run's `steps` give its MCP items (a completed run's)."""
    if task.status is TaskStatus.REQUIRES_ACTION and task.required_action is not None:
        action = task.required_action
        return waiting_items(
            task.task_id, task.action_step or 0, action.tool_calls, action.mcp_approval_requests or []
        )
    if task.status is not TaskStatus.COMPLETED:
        return []
    items = mcp_items(task.task_id, steps)
    items += [reasoning_item(task.task_id, task.reasoning)] if task.reasoning else []
    if has_message(task):
        status = "incomplete" if incomplete_reason(task) else "completed"
        items.append(message_item(task.task_id, message_parts(task), status))
    items += [function_call_item(task.task_id, i, call) for i, call in enumerate(task.tool_calls or [])]
    return items


def response_usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def response_object(task: Task, steps: Sequence[RunStep] = ()) -> dict[str, Any]:
    """A task as OpenAI's Response object (background mode); a run's recorded `steps` give its
    MCP items."""
    request = task.request
    completed = task.status is TaskStatus.COMPLETED
    error = None
    if task.status is TaskStatus.FAILED:
        code = _ERROR_CODES.get(task.error_code or "", "server_error")
        error = {"code": code, "message": task.error or "The task failed."}
    reason = incomplete_reason(task)
    return {
        "id": response_id(task.task_id),
        "object": "response",
        "created_at": int(task.created_at),
        "completed_at": int(task.completed_at) if completed and task.completed_at else None,
        "status": response_status(task),
        "background": True,
        "error": error,
        "incomplete_details": {"reason": reason} if reason else None,
        "instructions": request.system,
        "max_output_tokens": request.output_limit,
        "metadata": task.metadata if isinstance(task.metadata, dict) else {},
        "model": task.model or request.model or "",
        "output": output_items(task, steps),
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "reasoning": {"effort": request.reasoning_effort, "summary": None}
        if request.reasoning_effort
        else None,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_logprobs": request.top_logprobs,
        "text": text_config(request.response_format),
        "tool_choice": flat_tool_choice(request.tool_choice),
        "tools": [flat_tool(tool) for tool in request.tools or []]
        + [flat_mcp_tool(server) for server in task.mcp_servers or []],
        "truncation": "disabled",
        # The tier that served the calls, as the provider said; else the one asked for.
        "service_tier": (task.usage and task.usage.service_tier) or request.service_tier,
        "prompt_cache_key": request.prompt_cache_key,
        "safety_identifier": request.safety_identifier,
        "user": request.user,
        "store": True,
        "usage": response_usage(task.usage),
    }


def chat_completion(task: Task, usage: Usage | None, created: int) -> dict[str, Any]:
    """A completed task as OpenAI's chat.completion (a chat batch's output line's body)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": task.result or (None if task.refusal is not None or task.tool_calls else ""),
        "refusal": task.refusal,
        "annotations": [],
    }
    if task.tool_calls:
        message["tool_calls"] = [call.model_dump(mode="json") for call in task.tool_calls]
    return {
        "id": f"chatcmpl-{task.task_id}",
        "object": "chat.completion",
        "created": created,
        "model": task.model or task.request.model or "",
        "choices": [
            {"index": 0, "message": message, "finish_reason": task.finish_reason or "stop", "logprobs": None}
        ],
        "service_tier": (usage and usage.service_tier) or task.request.service_tier,
        "usage": usage
        and {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        },
    }
