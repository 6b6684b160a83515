"""A stand-in for the internet, made by the suite: a network namespace reached through the host's routing.

It answers on test addresses (TEST-NET-3) and on addresses no desktop may ever reach (a cloud's metadata
service, private and shared networks): a TCP port that accepts and closes (8080), a web server that
says which address it was reached on (80), and a DNS server (53 on ``FOREIGN_RESOLVER``) that knows
``allowed.test`` and ``blocked.test``, for an agent to try as its own resolver. The desktops' resolvers
forward to ``UPSTREAM``, a server with the same answers on the host's loopback (``upstream_dns``), so
that their queries never leave the host. Nothing of it leaves this host.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

NAMESPACE, LINK = "lbtest-outside", "lbtout0"
# The host's address on the link, and how to run a program inside the namespace (as a neighbour of the host).
HOST_SIDE = "10.216.0.1"
INSIDE = ("ip", "netns", "exec", NAMESPACE)
ALLOWED, BLOCKED = "203.0.113.80", "203.0.113.81"
FOREIGN_RESOLVER = "203.0.113.53"
UPSTREAM_PORT = 5399
UPSTREAM = f"127.0.0.1#{UPSTREAM_PORT}"
NAMES = {"allowed.test": ALLOWED, "blocked.test": BLOCKED}
NEVER = ("169.254.169.254", "10.77.0.5", "172.16.9.9", "192.168.77.7", "100.64.3.3")
ADDRESSES = (ALLOWED, BLOCKED, FOREIGN_RESOLVER, *NEVER)

SERVERS = """
import socket, socketserver, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"stand-in {self.connection.getsockname()[0]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Closer(socketserver.BaseRequestHandler):
    def handle(self):
        pass

web = ThreadingHTTPServer(("0.0.0.0", 80), Hello)
for server in (web, socketserver.ThreadingTCPServer(("0.0.0.0", 8080), Closer)):
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _remove() -> None:
    for address in ADDRESSES:
        subprocess.run(["ip", "route", "del", f"{address}/32"], capture_output=True)
    subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True)
    subprocess.run(["ip", "link", "del", LINK], capture_output=True)


def _dns_server(pid_file: Path, *where: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """A DNS server that knows the stand-in's names and answers "no such domain" for every other."""
    records = [f"--host-record={name},{address}" for name, address in NAMES.items()]
    command = ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts"]
    command += ["--bind-interfaces", "--address=/#/", *records, f"--pid-file={pid_file}", *where]
    return subprocess.Popen([*prefix, *command])


@contextlib.contextmanager
def upstream_dns(workdir: Path):
    """``UPSTREAM``, for as long as desktops may look names up: a resolver of theirs forwarding to nothing
    would keep their agents waiting on every look-up rather than tell them the name does not exist."""
    server = _dns_server(workdir / "upstream.pid", "--listen-address=127.0.0.1", f"--port={UPSTREAM_PORT}")
    try:
        yield
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def stand_in_internet(workdir: Path):
    """The namespace with its servers and the agent's foreign resolver (``UPSTREAM`` runs on its own)."""
    _remove()  # what an interrupted run left
    _ip("netns", "add", NAMESPACE)
    _ip("link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NAMESPACE)
    _ip("addr", "add", f"{HOST_SIDE}/30", "dev", LINK)
    _ip("link", "set", LINK, "up")
    _ip("-n", NAMESPACE, "addr", "add", "10.216.0.2/30", "dev", "eth0")
    for address in ADDRESSES:
        _ip("-n", NAMESPACE, "addr", "add", f"{address}/32", "dev", "eth0")
        _ip("route", "add", f"{address}/32", "via", "10.216.0.2")
    _ip("-n", NAMESPACE, "link", "set", "eth0", "up")
    _ip("-n", NAMESPACE, "link", "set", "lo", "up")
    _ip("-n", NAMESPACE, "route", "add", "default", "via", HOST_SIDE)
    servers = subprocess.Popen([*INSIDE, sys.executable, "-c", SERVERS], stdout=subprocess.PIPE, text=True)
    foreign = _dns_server(workdir / "foreign.pid", f"--listen-address={FOREIGN_RESOLVER}", prefix=INSIDE)
    try:
        assert servers.stdout.readline().strip() == "listening"
        yield
    finally:
        for process in (servers, foreign):
            process.kill()
            process.wait()
        _remove()
