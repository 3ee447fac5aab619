"""A webhook receiver for llmtasks in the standard library: verify, then act.

    LLMTASKS_WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py 8080

Give tasks `"webhook_url": "https://<this host>/hook"`. A 2xx tells llmtasks the event
arrived; anything else makes it try again later (same webhook-id, so deduplicate on it).
"""

from __future__ import annotations

import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from llmtasks_client import WebhookVerificationError, verify_webhook

SECRET = os.environ.get("LLMTASKS_WEBHOOK_SECRET", "")


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            event = verify_webhook(body, dict(self.headers), SECRET)
        except WebhookVerificationError:
            self.send_response(400)  # not from llmtasks, or replayed
            self.end_headers()
            return
        data = event.data  # a task's status object, or a batch's for batch.completed
        about = getattr(data, "task_id", None) or getattr(data, "batch_id", "")
        print(event.type, about, data.status.value, (getattr(data, "result", None) or "")[:80], flush=True)
        self.send_response(204)
        self.end_headers()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    HTTPServer(("127.0.0.1", port), Receiver).serve_forever()
