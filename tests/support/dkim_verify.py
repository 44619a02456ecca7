"""Verifies the DKIM signature of every message an SMTP test server received, with dkimpy:
an independent verifier, given the signer's public key instead of DNS.

Usage: dkim_verify.py SPOOL SELECTOR DOMAIN PUBLIC_KEY_DER_BASE64 [ED25519_SELECTOR ED25519_PUBLIC_KEY_BASE64]
More RSA keys' records (other From domains): DKIM_MORE_KEYS=SELECTOR:DOMAIN:PUBLIC_KEY_DER_BASE64,...
Prints one JSON line per message: its X-Outbox-Id, whether every one of its signatures
verifies (and the algorithms of those that do), and whether a copy with one character of
its body changed, or with one more Subject, From or To prepended, still verifies under any
of them (none may).
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
    records = {("%s._domainkey.%s" % (selector, domain)).lower(): ("v=DKIM1; k=rsa; p=%s" % public_key).encode()}
    if len(sys.argv) > 5:
        ed_selector, ed_public = sys.argv[5:7]
        records[("%s._domainkey.%s" % (ed_selector, domain)).lower()] = (
            "v=DKIM1; k=ed25519; p=%s" % ed_public).encode()

    for entry in filter(None, os.environ.get("DKIM_MORE_KEYS", "").split(",")):
        more_selector, more_domain, more_public = entry.split(":")
        records[("%s._domainkey.%s" % (more_selector, more_domain)).lower()] = (
            "v=DKIM1; k=rsa; p=%s" % more_public).encode()

    def dnsfunc(name, timeout=5):
        name = name.decode() if isinstance(name, bytes) else name
        return records.get(name.rstrip(".").lower())

    def verified_by(raw, logger=None):
        """The algorithms of the signatures of `raw` that verify, and how many it has."""
        count = sum(1 for line in raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
                    if line.lower().startswith(b"dkim-signature:"))
        signer = dkim.DKIM(raw, logger=logger)
        good = []
        for idx in range(count):
            try:
                ok = signer.verify(idx=idx, dnsfunc=dnsfunc)
            except dkim.DKIMException as e:  # what dkim.verify() takes for a failure
                (logger or LOG).debug("signature %d: %s", idx, e)
                ok = False
            if ok:
                good.append(signer.signature_fields.get(b"a", b"").decode())
        return good, count

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
            good, count = verified_by(raw, LOG)
            print(json.dumps({
                "outbox_id": message["outbox_id"],
                "verified": count > 0 and len(good) == count,
                "algorithms": good,
                "tampered_verified": any(verified_by(t)[0] for t in [tampered, *prepended]),
                "signature": next((v for k, v in message["headers"] if k.lower() == "dkim-signature"), None),
            }))


if __name__ == "__main__":
    main()
