"""An application's endpoint for outboxd's delivery callbacks, for the tests: every request
is verified with the Standard Webhooks organisation's own `standardwebhooks` package from
PyPI, never with outboxd's code.

A request that verifies is answered 204 and appended to SPOOL/callbacks.jsonl as
{"webhook_id", "type", "timestamp", "data", "received_at"}; one that does not is answered
401 and appended to SPOOL/forged.jsonl with the package's reason. With --fail-first N the
first N verified requests are answered 503 instead (an endpoint that is deploying).

Usage: callback_receiver.py --port PORT --spool DIR --secret whsec_... [--fail-first N]
"""

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--spool", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--fail-first", type=int, default=0)
    args = parser.parse_args()
    webhook = Webhook(args.secret)
    lock = threading.Lock()
    state = {"to_fail": args.fail_first}

    def append(name, record):
        with lock, open(os.path.join(args.spool, name), "a") as spool:
            spool.write(json.dumps(record) + "\n")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            headers = {name.lower(): value for name, value in self.headers.items()}
            try:
                payload = webhook.verify(body, headers)
            except WebhookVerificationError as e:
                append("forged.jsonl", {"reason": str(e), "headers": headers})
                self.answer(401)
                return
            with lock:
                failing = state["to_fail"] > 0
                if failing:
                    state["to_fail"] -= 1
            if failing:
                self.answer(503)
                return
            append("callbacks.jsonl", {
                "webhook_id": headers.get("webhook-id"),
                "type": payload.get("type"),
                "timestamp": payload.get("timestamp"),
                "data": payload.get("data"),
                "received_at": time.time(),
            })
            self.answer(204)

        def answer(self, status):
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("READY", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
