"""Amazon SES's API v2 as moto (a third-party AWS emulator, PyPI `moto[server]`) serves it,
for outboxd's `ses://` relay tests.

It runs moto's own WSGI application on 127.0.0.1:PORT (any service, chosen by the request's
signature scope, as `moto_server` does), verifies the domains given with boto3's SES v2
client (`CreateEmailIdentity`, as an operator would), prints READY, and then, every 100 ms,
writes what moto has sent to SPOOL/messages.jsonl (one object per message: SES's
MessageId, the destinations, and the raw message's Message-ID and X-Outbox-Id), read from
moto's backend in this process.

With --throttle-every N --throttle-for SECONDS, every Nth SendEmail in the first SECONDS is
answered as SES answers a sender over its rate: HTTP 429, `x-amzn-ErrorType:
TooManyRequestsException`, each noted in SPOOL/throttled.jsonl. Nothing else is changed of
moto's answers (an unverified sender gets its `MessageRejected`).

Usage: ses_server.py --port PORT --spool DIR [--verify DOMAIN ...] [--region REGION]
       [--throttle-every N --throttle-for SECONDS]
"""

import argparse
import email
import json
import os
import sys
import threading
import time

import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.ses.models import ses_backends
from werkzeug.serving import make_server


class Throttling:
    """Answers every Nth SendEmail with SES's 429 for the first SECONDS."""

    def __init__(self, app, every, seconds, spool):
        self.app, self.every, self.seconds, self.spool = app, every, seconds, spool
        self.started, self.count, self.lock = time.time(), 0, threading.Lock()

    def __call__(self, environ, start_response):
        sending = environ.get("PATH_INFO", "").endswith("/v2/email/outbound-emails")
        if sending and self.every and time.time() - self.started < self.seconds:
            with self.lock:
                self.count += 1
                throttle = self.count % self.every == 0
            if throttle:
                with open(os.path.join(self.spool, "throttled.jsonl"), "a") as out:
                    out.write(json.dumps({"at": time.time()}) + "\n")
                body = json.dumps({"message": "Maximum sending rate exceeded."}).encode()
                start_response("429 Too Many Requests", [
                    ("Content-Type", "application/json"),
                    ("x-amzn-ErrorType", "TooManyRequestsException:http://internal.amazon.com/coral/com.amazon.simpleemailservicev2/"),
                    ("Content-Length", str(len(body))),
                ])
                return [body]
        return self.app(environ, start_response)


def dump_sent(spool, region):
    backend = ses_backends[DEFAULT_ACCOUNT_ID][region]
    written = 0
    path = os.path.join(spool, "messages.jsonl")
    while True:
        sent = list(backend.sent_messages)
        if len(sent) > written:
            with open(path, "a") as out:
                for message in sent[written:]:
                    raw = getattr(message, "raw_data", "")
                    parsed = email.message_from_string(raw)
                    out.write(json.dumps({
                        "ses_message_id": message.id,
                        "destinations": list(getattr(message, "destinations", [])),
                        "message_id": str(parsed.get("Message-ID", "")),
                        "outbox_id": str(parsed.get("X-Outbox-Id", "")),
                    }) + "\n")
            written = len(sent)
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--spool", required=True)
    parser.add_argument("--verify", action="append", default=[])
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--throttle-every", type=int, default=0)
    parser.add_argument("--throttle-for", type=float, default=0)
    args = parser.parse_args()

    app = DomainDispatcherApplication(create_backend_app)
    app = Throttling(app, args.throttle_every, args.throttle_for, args.spool)
    server = make_server("127.0.0.1", args.port, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    client = boto3.client(
        "sesv2", region_name=args.region, endpoint_url=f"http://127.0.0.1:{args.port}",
        aws_access_key_id="testing", aws_secret_access_key="testing")
    for domain in args.verify:
        client.create_email_identity(EmailIdentity=domain)
    threading.Thread(target=dump_sent, args=(args.spool, args.region), daemon=True).start()
    print("READY", flush=True)
    # Until the test closes stdin (or goes away).
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
