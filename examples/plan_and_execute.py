"""Plan-and-Execute: research across an MCP server's documents and write a report.

The seed's long task in three phases, each a task of llmtasks:
1. plan: one call whose answer must fit a schema (`response_format`), a list of questions;
2. execute: an agent run for each question, side by side, with the MCP server's tools (the
   worker lists them once a run, calls them and records each step), each answering its question;
3. report: one call that writes the report from the findings.
No process of yours waits on a model: the SDK submits, then polls until each task ends.

    export LLMTASKS_API_URL=http://127.0.0.1:3000 LLMTASKS_API_KEY=lt_...   # the key make up printed
    python examples/plan_and_execute.py "How do llmtasks' webhooks and batches work?" \
        --mcp-url http://127.0.0.1:8765/mcp

Without --mcp-url it serves the project's test MCP server (llmtasks_local.mcp_docs, a few
documents) on 127.0.0.1 while it runs. The local stack's mock LLM plays an agent only when told:
--mock-agent-steps N asks it for N tool turns a run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict

import llmtasks_client


class Plan(BaseModel):
    """The planner's answer: the questions the research must answer, in order."""

    model_config = ConfigDict(extra="forbid")

    questions: list[str]


@dataclass(frozen=True)
class Finding:
    question: str
    answer: str
    tool_calls: int  # the MCP tools the run called


@dataclass(frozen=True)
class Report:
    text: str
    findings: list[Finding]
    tasks: int
    tokens: int
    cost_usd: Decimal


PLANNER = "Break the topic into at most 4 research questions that the documents can answer."
RESEARCHER = (
    "Answer the question from the documents: search them, read what is relevant, and cite the"
    " documents you used."
)
WRITER = "Write a short report on the topic from the findings, one section a question."
MOST_QUESTIONS = 4


def plan(client: llmtasks_client.Client, topic: str, *, model: str) -> tuple[Plan, llmtasks_client.TaskView]:
    task = client.submit(
        messages=[{"role": "developer", "content": PLANNER}, {"role": "user", "content": topic}],
        response_format=Plan,
        model=model,
    )
    done = client.wait(task.task_id)
    return Plan.model_validate(done.parsed), done


def research(
    client: llmtasks_client.Client,
    questions: list[str],
    server: dict[str, Any],
    *,
    model: str,
    hint: str = "",
) -> tuple[list[Finding], list[llmtasks_client.TaskView]]:
    """An agent run a question, all submitted before any is waited for: they run side by side."""
    runs = [
        client.submit(
            messages=[
                {"role": "developer", "content": RESEARCHER},
                {"role": "user", "content": question + hint},
            ],
            tools=[server],
            model=model,
            max_steps=10,
        )
        for question in questions
    ]
    findings, ended = [], []
    for question, run in zip(questions, runs, strict=True):
        done = client.wait(run.task_id)
        if done.status is not llmtasks_client.TaskStatus.COMPLETED:
            raise RuntimeError(f"the research run for {question!r} ended {done.status.value}: {done.error}")
        steps = client.steps(run.task_id, limit=100).steps
        called = sum(step.type == "tool_call" for step in steps)
        findings.append(Finding(question, done.result or "", called))
        ended.append(done)
    return findings, ended


def write(
    client: llmtasks_client.Client, topic: str, findings: list[Finding], *, model: str
) -> llmtasks_client.TaskView:
    notes = "\n\n".join(f"Question: {f.question}\nFindings: {f.answer}" for f in findings)
    task = client.submit(
        messages=[
            {"role": "developer", "content": WRITER},
            {"role": "user", "content": f"Topic: {topic}\n\n{notes}"},
        ],
        model=model,
    )
    return client.wait(task.task_id)


def plan_and_execute(
    client: llmtasks_client.Client, topic: str, mcp_url: str, *, model: str, agent_steps: int | None = None
) -> Report:
    server = {"type": "mcp", "server_label": "docs", "server_url": mcp_url, "require_approval": "never"}
    hint = f" [mock:agent-steps={agent_steps}]" if agent_steps else ""
    planned, planner = plan(client, topic, model=model)
    questions = [q for q in planned.questions if q.strip()][:MOST_QUESTIONS] or [topic]
    findings, runs = research(client, questions, server, model=model, hint=hint)
    report = write(client, topic, findings, model=model)
    tasks = [planner, *runs, report]
    usage = [task.usage for task in tasks if task.usage is not None]
    return Report(
        text=report.result or "",
        findings=findings,
        tasks=len(tasks),
        tokens=sum(u.total_tokens for u in usage),
        cost_usd=sum((Decimal(repr(u.cost_usd)) for u in usage if u.cost_usd), Decimal(0)),
    )


@contextlib.contextmanager
def documents_server(url: str | None) -> Iterator[str]:
    """`url`, or the project's test MCP server on a free port of 127.0.0.1 while the block runs."""
    if url is not None:
        yield url
        return
    import socket

    from llmtasks_local.mcp_docs import serving

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with serving(port) as served:
        yield served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topic")
    parser.add_argument("--mcp-url", help="An MCP server over Streamable HTTP (default: the test one).")
    parser.add_argument("--model", default=os.environ.get("LLMTASKS_MODEL", "gpt-4o-mini"))
    parser.add_argument("--mock-agent-steps", type=int, help="Tell the local mock LLM to take N tool turns.")
    args = parser.parse_args()
    api = os.environ.get("LLMTASKS_API_URL", "http://127.0.0.1:3000")
    with (
        documents_server(args.mcp_url) as url,
        llmtasks_client.Client(api, os.environ["LLMTASKS_API_KEY"]) as client,
    ):
        report = plan_and_execute(
            client, args.topic, url, model=args.model, agent_steps=args.mock_agent_steps
        )
    for finding in report.findings:
        print(f"- {finding.question} ({finding.tool_calls} tool calls)")
    print()
    print(report.text)
    print()
    print(f"{report.tasks} tasks, {report.tokens} tokens, ${report.cost_usd}")


if __name__ == "__main__":
    main()
