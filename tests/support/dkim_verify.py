"""Verifies the DKIM signature of every message an SMTP test server received, with dkimpy:
an independent verifier, given the signer's public key instead of DNS.

Usage: dkim_verify.py SPOOL SELECTOR DOMAIN PUBLIC_KEY_DER_BASE64
Prints one JSON line per message: its X-Outbox-Id, whether its signature verifies, and
whether a copy with one character of its body changed, or with one more Subject, From or
To prepended, still verifies (none may).
"""

import base64
import json
import os
import sys

import logging

import dkim


# Why a signature fails, on stderr, for the test's message.
logging.basicConfig(stream=sys.stderr, level=logging.DEBUG, format="%(message)s")
LOG = logging.getLogger("dkim")


def main():
    spool, selector, domain, public_key = sys.argv[1:5]
    record = ("v=DKIM1; k=rsa; p=%s" % public_key).encode()
    wanted = ("%s._domainkey.%s" % (selector, domain)).lower()

    def dnsfunc(name, timeout=5):
        name = name.decode() if isinstance(name, bytes) else name
        return record if name.rstrip(".").lower() == wanted else None

    with open(os.path.join(spool, "messages.jsonl")) as f:
        for line in f:
            message = json.loads(line)
            raw = base64.b64decode(message["raw"])
            head, _, body = raw.partition(b"\r\n\r\n")
            tampered = head + b"\r\n\r\n" + body.replace(b"a", b"b", 1)
            prepended = [
                b"%s: forged\r\n" % name + raw
                for name in (b"Subject", b"From", b"To", b"Reply-To")
            ]
            print(json.dumps({
                "outbox_id": message["outbox_id"],
                "verified": bool(dkim.verify(raw, dnsfunc=dnsfunc, logger=LOG)),
                "tampered_verified": bool(dkim.verify(tampered, dnsfunc=dnsfunc))
                or any(dkim.verify(p, dnsfunc=dnsfunc) for p in prepended),
                "signature": next((v for k, v in message["headers"] if k.lower() == "dkim-signature"), None),
            }))


if __name__ == "__main__":
    main()
