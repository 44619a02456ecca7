"""A private, real Postfix instance for outboxd's tests: the application's relay (smarthost),
and a mail system that answers with real RFC 3464 delivery status notifications.

Everything of an instance lives under DIR, nothing else on the host is touched:
  DIR/etc/       its config_directory: main.cf, master.cf, transport (a texthash: map)
  DIR/spool/     its queue_directory (created and owned as Postfix wants by `postfix start`)
  DIR/data/      its data_directory (master.lock, ...)
  DIR/maillog    its log (maillog_file through its own postlogd; no syslog needed)
  DIR/start.log, DIR/stop.log  the output of `postfix start` and `postfix stop`
The system Postfix (/etc/postfix, /var/spool/postfix) is neither read for settings nor
changed, and never started: the instance is a secondary one, run with `postfix -c DIR/etc`,
which root may do without listing DIR/etc in the default main.cf's
alternate_config_directories. Postfix's master must run as root, so must this script.
DIR is made 0755 (Postfix's own processes run as user `postfix` and must reach DIR/spool),
so every directory above DIR must be searchable by others (a 0700 tempdir must be DIR
itself, not a parent of it).

Commands:
  start --dir DIR --port PORT [--relay HOST:PORT] [--dead-domain DOMAIN]
        [--transport DOMAIN=HOST:PORT ...]
      Writes the configuration and starts the instance. Its smtpd listens on
      127.0.0.1:PORT only (no other inet listener); any client on 127.0.0.0/8 may send to
      any domain (mynetworks, no relay restriction, no rate or connection limits, no
      in_flow_delay), so it serves as the application's relay. Prints READY once PORT
      answers with its 220 greeting; the instance keeps running as daemons after this
      script exits. A DIR whose instance is running is stopped first. A DIR that held a
      stopped instance is started again with its queue as it was (mail queued while it was
      down is delivered).
        --relay HOST:PORT  mail for any domain not otherwise routed goes by SMTP to
                           [HOST]:PORT (relayhost). Without it such mail bounces
                           (error:5.4.4), so an instance never tries real destinations.
        --dead-domain D    D is a local domain (mydestination) whose every recipient is
                           accepted at RCPT (local_recipient_maps empty) and then fails
                           delivery as `5.1.1 unknown user`: Postfix's bounce daemon sends
                           a real multipart/report DSN (message/delivery-status, Action:
                           failed, Status: 5.1.1) to the envelope sender. (Local delivery
                           is the error(8) agent, not local(8): local(8) would deliver to
                           real system users such as `nobody` or `root` in /var/mail.)
        --transport D=HOST:PORT  mail for domain D goes by SMTP to [HOST]:PORT (e.g. the
                           domain of the bounce address, so a DSN reaches a test's own
                           SMTP server). Repeatable.
      DNS is never used: relays are bracketed addresses, smtp_dns_support_level=disabled,
      smtp_host_lookup=native, smtpd_peername_lookup=no. Retries are quick
      (queue_run_delay 1s, backoff 1-2s), delivery to a relay that is down is retried
      until it is back (maximal_queue_lifetime is Postfix's default 5d). Relayed messages
      are unchanged but for Postfix's Received: header on top (no MIME conversion, so
      DKIM signatures stay valid). A relay stopped, or a downstream server going away,
      in the middle of a message can deliver it twice ("message may be sent more than
      once" in DIR/maillog), as any real MTA would.
  stop --dir DIR
      `postfix -c DIR/etc stop` (or `abort`, and SIGKILL of the master's process group as
      the last resort); returns when the master has exited and PORT refuses connections.
      Queued mail stays in DIR/spool.
  flush --dir DIR
      `postqueue -c DIR/etc -f`: attempt delivery of all queued mail now.
  queue --dir DIR
      Prints the number of messages in the instance's queue (files in its incoming,
      active, deferred, hold and maildrop queues), e.g. to wait until it forwarded all.

Usage: postfix.py start --dir DIR --port PORT [--relay HOST:PORT] [--dead-domain DOMAIN]
                        [--transport DOMAIN=HOST:PORT ...] [--timeout SECONDS]
       postfix.py stop|flush|queue --dir DIR
(start prints READY when the instance answers; several instances, each with its own DIR
and PORT, may run at once)
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time

POSTFIX = "/usr/sbin/postfix"
POSTQUEUE = "/usr/sbin/postqueue"
# The queues that hold messages (defer, bounce and trace hold per-message logs).
MESSAGE_QUEUES = ("maildrop", "incoming", "active", "deferred", "hold")
# What `postfix start` creates in a new queue_directory (from /etc/postfix/postfix-files).
QUEUE_DIRECTORIES = MESSAGE_QUEUES + ("bounce", "corrupt", "defer", "flush", "private", "public",
                                      "pid", "saved", "trace")


def fail(message):
    print("postfix.py: %s" % message, file=sys.stderr, flush=True)
    sys.exit(1)


def paths(directory):
    directory = os.path.abspath(directory)
    return {
        "dir": directory,
        "etc": os.path.join(directory, "etc"),
        "spool": os.path.join(directory, "spool"),
        "data": os.path.join(directory, "data"),
        "maillog": os.path.join(directory, "maillog"),
        "pidfile": os.path.join(directory, "spool", "pid", "master.pid"),
        "portfile": os.path.join(directory, "etc", "port"),
    }


def host_port(value):
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError("expected HOST:PORT, got %r" % value)
    return host.strip("[]"), int(port)


def transport_entry(value):
    domain, sep, target = value.partition("=")
    if not sep or not domain:
        raise argparse.ArgumentTypeError("expected DOMAIN=HOST:PORT, got %r" % value)
    return domain.lower(), host_port(target)


def main_cf(p, port, relay, dead_domain):
    destinations = ["$myhostname", "localhost"] + ([dead_domain] if dead_domain else [])
    if relay:
        routing = "relayhost = [%s]:%d\ndefault_transport = smtp" % relay
    else:
        routing = "relayhost =\ndefault_transport = error:5.4.4 no --relay given to this test Postfix"
    return """\
# Written by tests/support/postfix.py: a private Postfix instance for tests.
compatibility_level = 3.6
queue_directory = {spool}
data_directory = {data}
mail_owner = postfix
setgid_group = postdrop
readme_directory = no
html_directory = no
maillog_file = {maillog}
maillog_file_prefixes = {dir}
syslog_name = postfix-{port}

myhostname = postfix.test
mydomain = postfix.test
myorigin = $myhostname
mydestination = {destinations}
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject
smtpd_recipient_restrictions = permit_mynetworks, reject
smtpd_peername_lookup = no
smtpd_banner = $myhostname ESMTP Postfix (test instance)

# Local domains: every recipient accepted at RCPT, then "unknown user" (a DSN).
local_recipient_maps =
alias_maps =
alias_database =
local_transport = error:5.1.1 unknown user
smtpd_reject_unlisted_recipient = no
biff = no
append_dot_mydomain = no
recipient_delimiter =

{routing}
transport_maps = texthash:{etc}/transport
smtp_dns_support_level = disabled
smtp_host_lookup = native
lmtp_host_lookup = native
smtp_address_preference = ipv4
smtp_tls_security_level = none
smtpd_tls_security_level = none
smtp_connect_timeout = 5s
# Relay messages byte for byte (but for Received:), so DKIM signatures stay valid.
disable_mime_output_conversion = yes

# Quick retries, immediate bounces, no delay warnings.
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
delay_warning_time = 0h

# A test drains thousands of messages over parallel connections.
default_process_limit = 100
in_flow_delay = 0s
smtpd_client_connection_count_limit = 0
smtpd_client_connection_rate_limit = 0
smtpd_client_message_rate_limit = 0
smtpd_client_recipient_rate_limit = 0
smtpd_client_new_tls_session_rate_limit = 0
smtpd_client_auth_rate_limit = 0
smtpd_error_sleep_time = 0s
smtpd_soft_error_limit = 1000
smtpd_hard_error_limit = 1000
smtpd_junk_command_limit = 100000
""".format(destinations=", ".join(destinations), routing=routing, port=port, **p)


# chroot "n" everywhere: a chroot under DIR/spool would need copies of /etc files.
MASTER_CF = """\
# Written by tests/support/postfix.py: a private Postfix instance for tests.
# service type  private unpriv  chroot  wakeup  maxproc command + args
127.0.0.1:{port} inet n  -       n       -       -       smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
tlsmgr    unix  -       -       n       1000?   1       tlsmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
local     unix  -       n       n       -       -       local
virtual   unix  -       n       n       -       -       virtual
lmtp      unix  -       -       n       -       -       lmtp
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""


def run(argv, log_path=None, timeout=60):
    """Runs a Postfix command; its output goes to a file, never a pipe, so that a daemon
    that kept an inherited descriptor could not hold up whoever reads ours."""
    log_path = log_path or os.devnull
    with open(log_path, "ab") as log:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                              timeout=timeout).returncode


def master_pid(p):
    try:
        with open(p["pidfile"]) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return False
    # State is the field after "(comm)"; a zombie has exited.
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"master" in f.read()
    except OSError:
        return False


def greeting(port, timeout=1.0):
    """The first line the server at 127.0.0.1:PORT sends, or None."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            data = b""
            while b"\n" not in data:
                chunk = s.recv(512)
                if not chunk:
                    break
                data += chunk
            try:
                s.sendall(b"QUIT\r\n")
            except OSError:
                pass
            return data.decode("latin-1").strip()
    except OSError:
        return None


def refuses(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return False
    except OSError:
        return True


def saved_port(p):
    try:
        with open(p["portfile"]) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def start(args):
    if os.geteuid() != 0:
        fail("Postfix's master must run as root")
    p = paths(args.dir)
    if master_pid(p):
        stop_instance(p)
    for key in ("dir", "etc"):
        os.makedirs(p[key], exist_ok=True)
    os.chmod(p["dir"], 0o755)
    os.chmod(p["etc"], 0o755)
    # Postfix's processes run as `postfix` and must reach DIR/spool.
    parent = os.path.dirname(p["dir"])
    while parent != "/":
        if not os.stat(parent).st_mode & 0o001:
            fail("%s is not searchable by others, so user postfix cannot reach %s"
                 % (parent, p["spool"]))
        parent = os.path.dirname(parent)
    # queue_directory must be root's and not group/other writable; Postfix creates the rest.
    os.makedirs(p["spool"], exist_ok=True)
    os.chmod(p["spool"], 0o755)

    def write(name, text):
        path = os.path.join(p["etc"], name)
        with open(path, "w") as f:
            f.write(text)
        # Postfix commands wait (~2 s, in 0.3 s naps) while main.cf or master.cf has an
        # mtime this recent; backdated, `postfix start` does not.
        past = time.time() - 10
        os.utime(path, (past, past))

    write("main.cf", main_cf(p, args.port, args.relay, args.dead_domain))
    write("master.cf", MASTER_CF.format(port=args.port))
    write("transport", "".join("%s smtp:[%s]:%d\n" % (domain, host, port)
                               for domain, (host, port) in args.transport))
    write("port", "%d\n" % args.port)

    if not refuses(args.port):
        fail("port %d is already in use" % args.port)
    # On a restart the queue directories exist already: skip `postfix check` (post-install
    # create-missing, postsuper, permission checks: ~1 s of shell), as `quick-start` does.
    if all(os.path.isdir(os.path.join(p["spool"], name)) for name in QUEUE_DIRECTORIES):
        with open(os.path.join(p["spool"], "quick-start"), "w"):
            pass
    log = os.path.join(p["dir"], "start.log")
    with open(log, "w"):
        pass
    code = run([POSTFIX, "-c", p["etc"], "start"], log, timeout=args.timeout)
    if code != 0:
        with open(log) as f:
            fail("postfix start failed (%d):\n%s" % (code, f.read()))
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        line = greeting(args.port)
        if line and line.startswith("220"):
            print("READY", flush=True)
            return
        time.sleep(0.05)
    fail("no 220 greeting on 127.0.0.1:%d within %ss (see %s)" % (args.port, args.timeout, p["maillog"]))


def stop_instance(p, timeout=30.0):
    pid = master_pid(p)
    port = saved_port(p)
    if pid:
        log = os.path.join(p["dir"], "stop.log")
        if run([POSTFIX, "-c", p["etc"], "stop"], log, timeout=timeout) != 0 and alive(pid):
            run([POSTFIX, "-c", p["etc"], "abort"], log, timeout=timeout)
        deadline = time.time() + timeout
        while alive(pid) and time.time() < deadline:
            time.sleep(0.05)
        if alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)  # the master leads its process group
            except OSError:
                pass
    deadline = time.time() + timeout
    while port and not refuses(port) and time.time() < deadline:
        time.sleep(0.05)
    if (pid and alive(pid)) or (port and not refuses(port)):
        fail("the instance in %s did not stop" % p["dir"])


def stop(args):
    stop_instance(paths(args.dir))


def flush(args):
    p = paths(args.dir)
    if run([POSTQUEUE, "-c", p["etc"], "-f"]) != 0:
        fail("postqueue -f failed (is the instance in %s running?)" % p["dir"])


def queue(args):
    p = paths(args.dir)
    count = 0
    for name in MESSAGE_QUEUES:
        for _, _, files in os.walk(os.path.join(p["spool"], name)):
            count += sum(1 for f in files if re.fullmatch(r"[0-9A-Za-z]+", f))
    print(count, flush=True)


def main():
    parser = argparse.ArgumentParser(description="A private Postfix instance for tests.")
    commands = parser.add_subparsers(dest="command", required=True)
    start_parser = commands.add_parser("start")
    start_parser.add_argument("--dir", required=True)
    start_parser.add_argument("--port", type=int, required=True)
    start_parser.add_argument("--relay", type=host_port, help="HOST:PORT of the downstream SMTP server")
    start_parser.add_argument("--dead-domain", help="a local domain where every recipient is unknown")
    start_parser.add_argument("--transport", type=transport_entry, action="append", default=[],
                              help="DOMAIN=HOST:PORT: mail for DOMAIN goes there (repeatable)")
    start_parser.add_argument("--timeout", type=float, default=60.0)
    for name in ("stop", "flush", "queue"):
        commands.add_parser(name).add_argument("--dir", required=True)
    args = parser.parse_args()
    {"start": start, "stop": stop, "flush": flush, "queue": queue}[args.command](args)


if __name__ == "__main__":
    main()
