"""A small HTTPS file server for outboxd's tests: it serves one directory and notes every
request's path in ROOT/requests.log. It stands in for SNS's certificate host and for the
SubscribeURL a subscription confirmation visits.

Usage: https_server.py --port PORT --root DIR --cert PEM --key PEM [--delay S]   (prints READY)

With --delay, every file is served that many seconds after its request: a slow host, so
that requests a test sends together are sure to meet while a fetch is still under way.
"""

import argparse
import functools
import http.server
import os
import ssl
import sys
import time


class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        with open(os.path.join(self.directory, "requests.log"), "a") as log:
            log.write(self.path + "\n")
        if self.path.startswith("/confirm"):
            body = b"<ConfirmSubscriptionResponse/>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        time.sleep(self.server.delay)
        super().do_GET()

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    handler = functools.partial(Handler, directory=args.root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    server.delay = args.delay
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("READY", flush=True)
    sys.stdout.close()
    server.serve_forever()


if __name__ == "__main__":
    main()
