"""The seed's design, as its design note describes it, for the bench to measure llmtasks against:
Flask + Celery (a threads pool) + Redis.

`POST /tasks` stores a hash with a TTL and enqueues a Celery task; the worker calls the LLM over
httpx with retries (429 and 5xx, honouring Retry-After) and writes the result into the hash;
`GET /tasks/<id>` reads the hash. One addition, so that both sides are driven by the same client
code: `GET /tasks/<id>?wait=N` holds the reply until the task ends or N seconds pass, as llmtasks
does (without it the bench's clients would poll in a tight loop).

A submit's `max_completion_tokens`, if given, goes to the LLM with its prompt; BASELINE_LLM_KEYS
(keys separated by commas) are used in turn, one a call, as a pool of keys without pacing: the
seed's design retries each 429 after its Retry-After (else a backoff) and nothing more.

Configured by the environment: BASELINE_REDIS_URL, LLM_BASE_URL, BASELINE_TTL_S. Started by
bench/baseline.py: gunicorn serves `web`, `celery -A baseline_app worker -P threads` runs `app`.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import redis
from celery import Celery
from flask import Flask, jsonify, request

REDIS_URL = os.environ.get("BASELINE_REDIS_URL", "redis://127.0.0.1:6379/0")
LLM_BASE_URL = os.environ.get("LLM_BASE_URL", "http://127.0.0.1:8800/v1")
TTL_S = int(os.environ.get("BASELINE_TTL_S", "86400"))
RETRIES = 3
_KEYS = itertools.cycle([k for k in os.environ.get("BASELINE_LLM_KEYS", "").split(",") if k] or [""])
TERMINAL = ("completed", "failed")

app = Celery("baseline", broker=REDIS_URL)
# One message at a time per thread, acknowledged when done: a long call never holds queued ones.
app.conf.update(worker_prefetch_multiplier=1, task_acks_late=True, broker_connection_retry_on_startup=True)
store = redis.Redis.from_url(REDIS_URL, decode_responses=True)
web = Flask("baseline")
_llm = httpx.Client(timeout=900, limits=httpx.Limits(max_connections=200))


@web.post("/tasks")
def submit() -> Any:
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
        return jsonify({"error": "a JSON body with a prompt"}), 422
    task_id = uuid.uuid4().hex
    key = f"task:{task_id}"
    fields = {"status": "pending", "prompt": body["prompt"], "created_at": time.time()}
    if isinstance(body.get("max_completion_tokens"), int):
        fields["max_completion_tokens"] = body["max_completion_tokens"]
    store.hset(key, mapping=fields)
    store.expire(key, TTL_S)
    call_llm.delay(task_id)
    return jsonify({"task_id": task_id, "status": "pending"}), 202


@web.get("/tasks/<task_id>")
def status(task_id: str) -> Any:
    wait_s = min(float(request.args.get("wait", 0)), 25.0)
    give_up = time.monotonic() + wait_s
    while True:
        task = store.hgetall(f"task:{task_id}")
        if not task:
            return jsonify({"error": "no such task"}), 404
        if task["status"] in TERMINAL or time.monotonic() >= give_up:
            break
        time.sleep(0.05)
    task.pop("prompt", None)
    return jsonify({"task_id": task_id, **task})


@app.task
def call_llm(task_id: str) -> None:
    key = f"task:{task_id}"
    prompt = store.hget(key, "prompt")
    if prompt is None:
        return  # expired
    store.hset(key, "status", "processing")
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]}
    cap = store.hget(key, "max_completion_tokens")
    if cap is not None:
        body["max_completion_tokens"] = int(cap)
    error = "no attempt"
    for attempt in range(RETRIES + 1):
        api_key = next(_KEYS)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            reply = _llm.post(f"{LLM_BASE_URL}/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
            time.sleep(2**attempt)
            continue
        if reply.status_code == 200:
            answer = reply.json()
            store.hset(
                key,
                mapping={
                    "status": "completed",
                    "result": answer["choices"][0]["message"]["content"],
                    "usage": json.dumps(answer.get("usage") or {}),
                    "completed_at": datetime.now(tz=UTC).isoformat(),
                },
            )
            return
        error = f"LLM answered {reply.status_code}"
        if reply.status_code not in (429, 500, 502, 503, 504):
            break
        time.sleep(float(reply.headers.get("retry-after") or 2**attempt))
    store.hset(
        key, mapping={"status": "failed", "error": error, "completed_at": datetime.now(tz=UTC).isoformat()}
    )
