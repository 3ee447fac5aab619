"""The local stack's state dir: made ready (writable; emptied by --reset), watched while the
stack runs (the embedded endpoint refuses changes it cannot write), and a clean stop's snapshot
asked of the endpoint. What it holds is the endpoint's (emulator/journal.py) and the stack's
own small files below."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from llmtasks_local.emulator.journal import state_files
from llmtasks_local.emulator.moto_server import STATE_PATH
from llmtasks_local.emulator.stack_keys import CONSOLE_KEYS, DEV_KEY
from llmtasks_local.tool_errors import ToolError

STATE_WATCH_S = 1.0  # how often the endpoint is asked whether its state dir takes changes
STREAM_CHECKPOINTS = "streams.json"  # the stream pollers' positions
EVENT_SOURCE_CHANGES = "event_source_mappings.json"  # the Lambda API's changes to the mappings


def prepare(state_dir: Path, *, reset: bool) -> None:
    """A state dir that can be written (ToolError: one line saying why not); emptied with reset."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        probe = state_dir / ".writable"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise ToolError(
            f"the state dir cannot be written: {error.strerror}",
            where=str(state_dir),
            fix="give a writable folder with --state-dir, or keep nothing with --no-state",
        ) from error
    if reset:
        kept = (STREAM_CHECKPOINTS, DEV_KEY, CONSOLE_KEYS, EVENT_SOURCE_CHANGES)
        for path in (*state_files(state_dir), *(state_dir / name for name in kept)):
            path.unlink(missing_ok=True)


def watch(endpoint_url: str, state_dir: Path, stop: threading.Event) -> threading.Thread:
    """A thread that says when the state dir stops taking changes (a full or read-only disk: the
    endpoint then refuses them, and submits answer 503) and when it takes them again."""

    def run() -> None:
        said: str | None = None
        # One client for the watch's life: httpx.get makes a client (and its TLS context) a call.
        with httpx.Client(timeout=5) as endpoint:
            while not stop.wait(STATE_WATCH_S):
                try:
                    problem = endpoint.get(f"{endpoint_url}{STATE_PATH}").json()["problem"]
                except (httpx.HTTPError, ValueError, KeyError):
                    continue
                if problem and problem != said:
                    print(
                        f"Error: the state dir cannot be written: {problem}: changes are refused and"
                        " submits answer 503 until it can (free some space, or make it writable)",
                        flush=True,
                    )
                elif said and not problem:
                    print(f"The state dir can be written again ({state_dir})", flush=True)
                said = problem

    thread = threading.Thread(target=run, name="state-watch", daemon=True)
    thread.start()
    return thread


def snapshot(endpoint_url: str, state_dir: Path) -> None:
    """The embedded endpoint writes a clean stop's snapshot."""
    reply = httpx.post(f"{endpoint_url}{STATE_PATH}", timeout=60)
    reply.raise_for_status()
    print(f"State kept in {state_dir} ({reply.json()['bytes']} bytes)", flush=True)
