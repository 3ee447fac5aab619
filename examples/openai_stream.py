"""Stream a background response with the official `openai` SDK, across segments.

llmtasks answers a streamed response in segments of up to 25 s (API Gateway holds a reply 30 s):
each segment is a complete text/event-stream reply that ends cleanly. A client reads on with
`responses.retrieve(id, stream=True, starting_after=<the last event's sequence_number>)` until an
event ends the response, and may do so at any time while the response lives (a day by default),
from any sequence number, after a dropped connection or a restart.

    export OPENAI_BASE_URL=http://127.0.0.1:3000/v1 OPENAI_API_KEY=lt_...   # the key make up printed
    python examples/openai_stream.py "Write a long story about queues"
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from openai import OpenAI
from openai.types.responses import ResponseStreamEvent

ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})


def stream_response(client: OpenAI, **create: Any) -> Iterator[ResponseStreamEvent]:
    """Every event of a new background response, in order, each once, segment after segment."""
    response_id = ""
    last_sequence = -1
    segment = client.responses.create(background=True, stream=True, **create)
    while True:
        for event in segment:
            if event.type == "response.created":
                response_id = event.response.id
            last_sequence = event.sequence_number
            yield event
            if event.type in ENDS:
                return
        # The segment ended before the response did: read on after its last event.
        segment = client.responses.retrieve(response_id, stream=True, starting_after=last_sequence)


if __name__ == "__main__":
    with OpenAI() as client:
        for event in stream_response(client, model="gpt-4o-mini", input=sys.argv[1]):
            if event.type == "response.output_text.delta":
                print(event.delta, end="", flush=True)
            elif event.type in ENDS:
                print(f"\n[{event.type}]")
