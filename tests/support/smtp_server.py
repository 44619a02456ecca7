"""A real SMTP server (aiosmtpd) for outboxd's tests, with replies chosen by recipient.

Recipients whose local part starts with:
  reject...   -> 550 5.7.1 at RCPT (permanent; the mailbox exists)
  defer...    -> 451 at RCPT (transient), every time
  deferlong...-> the same, with a reply of four long lines
  flakyN...   -> 451 at RCPT for the first N attempts at that address, then accepted
  slowN...    -> accepted after sleeping N seconds before the DATA reply
  hold...     -> the DATA reply is held until the file SPOOL/release exists (at most 60 s);
                 each held message is first noted in SPOOL/held.jsonl
  resetafter..-> the whole message is received, then the connection is reset without a
                 reply (the client cannot know whether it was delivered); noted in
                 SPOOL/reset.jsonl
  droprcpt... -> the connection is reset at RCPT, before the server takes anything
  lagN...     -> accepted after sleeping N milliseconds before the DATA reply
  unknown...  -> 550 5.1.1 at RCPT: the mailbox does not exist
  senderverify... -> 550 5.1.7 at RCPT about our sender, quoting another server's 5.1.1
  reply-NAME-...  -> at RCPT, the real reply NAME of tests/support/provider_replies.json
                     (Gmail's, Microsoft's, Postfix's ..., as their documentation gives them)
  datareply-NAME-... -> the same reply after DATA, as Exchange Online refuses
anything else is accepted, with a queue id in the reply as Postfix gives one (`250 2.0.0
Ok: queued as 1A2B3C`). Every accepted message is appended to SPOOL/messages.jsonl (its
queue id included), decoded by Python's email package, so the tests check what a
receiver would see.

With --defer-all every recipient gets 451: a mail server that is up but refusing mail.
With --throttle-every N --throttle-for SECONDS every Nth message of the first SECONDS gets
--throttle-reply (by default Amazon SES's `454 Throttling failure`), noted with its time in
SPOOL/throttled.jsonl.
With --greeting-delay SECONDS every new connection waits that long for its greeting.
With --refuse-after SECONDS --refuse-for SECONDS every command after the greeting in that
window (counted from the start) gets the real reply --refuse-reply (a name of
provider_replies.json, by default Gmail's `421 4.7.0 Try again later, closing connection.`)
and the connection is closed, as a relay that refuses everything for a while does; noted
in SPOOL/refused.jsonl.
With --reset-share P a share P of the messages is taken (spooled, as a relay that queued it)
and then the connection is reset before the reply: the client cannot know it was taken and
sends it again. Noted in SPOOL/reset.jsonl.

PIPELINING (RFC 2920) is offered, as by most real servers, unless --no-pipelining; each
record says whether its MAIL command arrived together with the commands after it.

With --tls-cert/--tls-key the server requires STARTTLS (or, with --smtps, speaks TLS from
the first byte); with --auth USER:PASSWORD it requires AUTH over TLS. Each record says
whether it came over TLS and as which user.

Usage: smtp_server.py --port PORT --spool DIR [--defer-all] [--no-pipelining]
       [--tls-cert PEM --tls-key PEM [--smtps]] [--auth USER:PASSWORD]
(prints READY when it listens)
"""

import argparse
import asyncio
import base64
import email
import email.policy
import json
import os
import random
import re
import signal
import ssl
import sys
import threading
import time
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult


class SlowGreetingSMTP(SMTP):
    """An SMTP session that waits before its greeting (aiosmtpd 1.4's _handle_client)."""

    greeting_delay = 0.0

    async def _handle_client(self):
        await asyncio.sleep(self.greeting_delay)
        await super()._handle_client()


class SlowGreetingController(Controller):
    def factory(self):
        return SlowGreetingSMTP(self.handler, **self.SMTP_kwargs)


# The real replies, by name, longest first so that a name is not taken for its prefix.
REPLIES = json.loads((Path(__file__).parent / "provider_replies.json").read_text())["replies"]
REPLY_NAMES = sorted(REPLIES, key=len, reverse=True)


def documented_reply(local, prefix):
    """The real reply a recipient `PREFIX-NAME-...` asks for, or None."""
    for name in REPLY_NAMES:
        if local.startswith("%s-%s-" % (prefix, name)):
            return REPLIES[name]["reply"]
    return None


class Handler:
    def __init__(self, spool, defer_all=False, pipelining=True, throttle_every=0, throttle_for=0.0,
                 accept_rate=0.0, throttle_reply=None, refuse=None, reset_share=0.0):
        self.spool = spool
        self.started_at = time.time()
        # (after, for, reply): the window of seconds from the start when everything is refused.
        self.refuse = refuse
        self.reset_share = reset_share
        self.random = random.Random(0)
        self.throttle_reply = throttle_reply or "454 4.7.0 Throttling failure: Maximum sending rate exceeded."
        # A relay's sending limit, as providers enforce it: a bucket of a second's worth of
        # messages, refilled at `accept_rate` a second; a message past it is refused 454.
        self.accept_rate = accept_rate
        self.queued = 0
        self.tokens = accept_rate
        self.refilled_at = time.time()
        self.defer_all = defer_all
        self.pipelining = pipelining
        self.throttle_every = throttle_every
        self.throttle_for = throttle_for
        self.messages_seen = 0
        self.first_message_at = None
        self.attempts = {}
        self.lock = threading.Lock()

    def refused(self, server):
        """The refusal to give now, closing the connection after it, or None."""
        if not self.refuse:
            return None
        after, during, reply = self.refuse
        if not after <= time.time() - self.started_at < after + during:
            return None
        with self.lock:
            with open(os.path.join(self.spool, "refused.jsonl"), "a") as f:
                f.write(json.dumps({"at": time.time()}) + "\n")
        asyncio.get_running_loop().call_later(0.05, server.transport.close)
        return reply

    async def handle_EHLO(self, server, session, envelope, hostname, responses):
        refusal = self.refused(server)
        if refusal:
            return [refusal]
        session.host_name = hostname
        if self.pipelining:
            responses.insert(-1, "250-PIPELINING")
        return responses

    async def hold(self, rcpt):
        with self.lock:
            with open(os.path.join(self.spool, "held.jsonl"), "a") as f:
                f.write(json.dumps({"rcpt": rcpt}) + "\n")
        release = os.path.join(self.spool, "release")
        for _ in range(3000):
            if os.path.exists(release):
                return
            await asyncio.sleep(0.02)

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        # Pipelined: RCPT and DATA were already read into the buffer with MAIL.
        envelope.pipelined = b"\n" in bytes(server._reader._buffer)
        refusal = self.refused(server)
        if refusal:
            return refusal
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@", 1)[0].lower()
        if local.startswith("droprcpt"):
            server.transport.abort()
            return "421 4.4.2 gone"
        if self.defer_all:
            return "451 4.3.2 System not accepting network messages"
        if local.startswith("senderverify"):
            return ("550 5.1.7 <%s>: Sender address rejected: undeliverable address: host "
                    "mx.sender.test said: 550 5.1.1 User unknown" % envelope.mail_from)
        documented = documented_reply(local, "reply")
        if documented:
            return documented
        if local.startswith("unknown"):
            return ("550 5.1.1 <%s>: Recipient address rejected: User unknown in local recipient "
                    "table" % address)
        if local.startswith("reject"):
            return "550 5.7.1 <%s>: refused by policy" % address
        if local.startswith("deferlong"):
            lines = ["4.3.0 line %d %s" % (i, "x" * 180) for i in range(4)]
            return "\r\n".join("451-" + l for l in lines[:-1]) + "\r\n451 " + lines[-1]
        if local.startswith("defer"):
            return "451 4.3.0 <%s>: try again later" % address
        flaky = re.match(r"flaky(\d+)", local)
        if flaky:
            with self.lock:
                seen = self.attempts.get(address, 0)
                self.attempts[address] = seen + 1
            if seen < int(flaky.group(1)):
                return "451 4.7.1 <%s>: greylisted, attempt %d" % (address, seen + 1)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        for rcpt in envelope.rcpt_tos:
            local = rcpt.split("@", 1)[0].lower()
            documented = documented_reply(local, "datareply")
            if documented:
                return documented
            slow = re.match(r"slow(\d+)", local)
            if slow:
                await asyncio.sleep(int(slow.group(1)))
            lag = re.match(r"lag(\d+)", local)
            if lag:
                await asyncio.sleep(int(lag.group(1)) / 1000)
            if local.startswith("hold"):
                await self.hold(rcpt)
            if local.startswith("resetafter"):
                with self.lock:
                    with open(os.path.join(self.spool, "reset.jsonl"), "a") as f:
                        f.write(json.dumps({"rcpt": rcpt}) + "\n")
                server.transport.abort()
                return "421 4.4.2 gone"
        if self.throttle_every or self.accept_rate:
            with self.lock:
                now = time.time()
                self.first_message_at = self.first_message_at or now
                self.messages_seen += 1
                throttled = (self.throttle_every and now - self.first_message_at < self.throttle_for
                             and self.messages_seen % self.throttle_every == 0)
                if self.accept_rate and not throttled:
                    self.tokens = min(self.accept_rate,
                                      self.tokens + (now - self.refilled_at) * self.accept_rate)
                    self.refilled_at = now
                    throttled = self.tokens < 1
                    if not throttled:
                        self.tokens -= 1
            if throttled:
                with self.lock:
                    with open(os.path.join(self.spool, "throttled.jsonl"), "a") as f:
                        f.write(json.dumps({"rcpt_tos": envelope.rcpt_tos, "at": now}) + "\n")
                return self.throttle_reply
        raw = envelope.original_content or envelope.content
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        text = msg.get_body(preferencelist=("plain",))
        html = msg.get_body(preferencelist=("html",))
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "headers": [[k, str(v)] for k, v in msg.items()],
            "subject": str(msg.get("Subject", "")),
            "message_id": str(msg.get("Message-ID", "")),
            "outbox_id": str(msg.get("X-Outbox-Id", "")),
            "pipelined": getattr(envelope, "pipelined", False),
            "tls": server.transport.get_extra_info("ssl_object") is not None,
            "auth_user": session.auth_data.login.decode() if session.auth_data else None,
            "text": text.get_content() if text is not None else None,
            "html": html.get_content() if html is not None else None,
            "received_at": time.time(),
            "raw": base64.b64encode(raw).decode(),
            "attachments": [
                {"filename": part.get_filename(), "content_type": part.get_content_type(),
                 "content_base64": base64.b64encode(part.get_payload(decode=True) or b"").decode()}
                for part in msg.iter_attachments()
            ],
        }
        with self.lock:
            self.queued += 1
            record["queue_id"] = "%X" % (0x1A2B00 + self.queued)
            with open(os.path.join(self.spool, "messages.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
            reset = self.reset_share and self.random.random() < self.reset_share
            if reset:
                with open(os.path.join(self.spool, "reset.jsonl"), "a") as f:
                    f.write(json.dumps({"rcpt": envelope.rcpt_tos, "taken": True}) + "\n")
        if reset:
            server.transport.abort()
            return "421 4.4.2 gone"
        return "250 2.0.0 Ok: queued as %s" % record["queue_id"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--spool", required=True)
    parser.add_argument("--defer-all", action="store_true", help="answer 451 to every recipient")
    parser.add_argument("--no-pipelining", action="store_true", help="do not offer PIPELINING")
    parser.add_argument("--tls-cert", help="PEM certificate chain: require STARTTLS")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--smtps", action="store_true", help="TLS from the first byte instead of STARTTLS")
    parser.add_argument("--auth", help="USER:PASSWORD to require (AUTH PLAIN or LOGIN, over TLS)")
    parser.add_argument("--greeting-delay", type=float, default=0.0, help="seconds before each greeting")
    parser.add_argument("--throttle-every", type=int, default=0,
                        help="answer 454 4.7.0 (throttling) to every Nth message...")
    parser.add_argument("--throttle-for", type=float, default=60.0,
                        help="...for this many seconds after the first message")
    parser.add_argument("--accept-rate", type=float, default=0.0,
                        help="accept this many messages a second (a second's burst), 454 4.7.0 to the rest")
    parser.add_argument("--throttle-reply", help="the reply of --throttle-every (default SES's 454)")
    parser.add_argument("--refuse-after", type=float, default=0.0,
                        help="seconds from the start before every command is refused...")
    parser.add_argument("--refuse-for", type=float, default=0.0, help="...for this many seconds")
    parser.add_argument("--refuse-reply", default="gmail-4-7-0",
                        help="the refusal: a reply's name in provider_replies.json")
    parser.add_argument("--reset-share", type=float, default=0.0,
                        help="take this share of messages, then reset the connection before the reply")
    args = parser.parse_args()
    os.makedirs(args.spool, exist_ok=True)
    refuse = None
    if args.refuse_for:
        refuse = (args.refuse_after, args.refuse_for, REPLIES[args.refuse_reply]["reply"])
    options = {}
    if args.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        if args.smtps:
            options["ssl_context"] = context
        else:
            options.update(tls_context=context, require_starttls=True)
    if args.auth:
        user, password = args.auth.split(":", 1)

        def authenticate(server, session, envelope, mechanism, auth_data):
            ok = auth_data.login.decode() == user and auth_data.password.decode() == password
            return AuthResult(success=ok, auth_data=auth_data)

        options.update(authenticator=authenticate, auth_required=True)
    SlowGreetingSMTP.greeting_delay = args.greeting_delay
    controller = SlowGreetingController(
        Handler(args.spool, args.defer_all, not args.no_pipelining, args.throttle_every, args.throttle_for,
                args.accept_rate, args.throttle_reply, refuse, args.reset_share), hostname="127.0.0.1", port=args.port,
        ready_timeout=10, **options
    )
    controller.start()
    print("READY", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # Stop too when the test process that started us goes away.
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stop.wait()
    controller.stop()


if __name__ == "__main__":
    main()
