"""The web server of every listener (pages and API, guest endpoint): daphne, except that a request's body
waits on disk, not in memory, until the application reads it.

Twisted collects a body in a temporary file, then daphne reads all of it into the application's queue
at once: one anonymous 8 GiB PUT became 8 GiB of the web server's memory before authentication or any
size check ran. Here a request keeps at most BODY_IN_MEMORY bytes of its body in that queue; the rest
stays in a temporary file of its own, read back chunk by chunk as the application asks (Django then
spools it to disk past FILE_UPLOAD_MAX_MEMORY_SIZE, and refuses what is too large for the endpoint).

And Twisted takes a body onto its disk before anything can check it, so a request is refused from its
headers, before a byte of its body is kept, when its body would be larger than any endpoint takes
(WEB_MAX_BODY_MIB), larger than the API's documents without credentials of any kind (an anonymous
client has nothing larger to send), or more than what the bodies being received may hold of the disk
together (WEB_BODIES_ON_DISK_MIB, answered 503 with Retry-After). A body without a length is cut off
where it passes the same bounds.

    python -m lebureau.server -b 127.0.0.1 -p 8000 lebureau.asgi:application   (daphne's options)
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from http import HTTPStatus

from daphne.cli import CommandLineInterface
from daphne.http_protocol import WebRequest
from daphne.server import Server
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext_lazy as _

# What one request's body may hold in the web server's memory while the application has not read it.
BODY_IN_MEMORY = 1024 * 1024


# The chunks in which a spooled body is read back.
READ_CHUNK = 64 * 1024


class _Spool:
    """The rest of one request's body past BODY_IN_MEMORY, in a temporary file (closed with the spool)."""

    def __init__(self):
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 (closed when the request's spool goes)
        self.size = self.read_at = 0

    def append(self, data: bytes) -> None:
        os.pwrite(self.file.fileno(), data, self.size)
        self.size += len(data)

    @property
    def unread(self) -> bool:
        return self.read_at < self.size

    def next_message(self) -> dict:
        data = os.pread(self.file.fileno(), READ_CHUNK, self.read_at)
        self.read_at += len(data)
        return {"type": "http.request", "body": data, "more_body": self.unread}


def _spooling(put_nowait):
    """The queue's `put_nowait`, past BODY_IN_MEMORY bytes of a body putting its rest in a spool (and one
    message saying so) instead."""
    held, spool = 0, None

    def put(message):
        nonlocal held, spool
        if message.get("type") == "http.request":
            body = message.get("body", b"")
            if spool is not None:
                spool.append(body)
                return
            held += len(body)
            if held > BODY_IN_MEMORY:
                spool = _Spool()
                spool.append(body)
                message = {"type": "http.request", "body": spool, "more_body": True}
        put_nowait(message)

    return put


def _reading_spooled(application):
    """The application, given a spooled body chunk by chunk when it reaches the message saying so. Daphne
    puts a whole body in one go before the application runs, so the spool is complete by then."""

    async def app(scope, receive, send):
        spool = None

        async def receive_read():
            nonlocal spool
            if spool is not None and spool.unread:
                return spool.next_message()
            message = await receive()
            if isinstance(message.get("body"), _Spool):
                spool = message["body"]
                return spool.next_message()
            return message

        return await application(scope, receive_read, send)

    return app


MIB = 1024 * 1024
# How long a client refused for the disk's sake is asked to wait; how long the rest of a refused body
# is read (and dropped) before its connection is closed.
RETRY_AFTER = 30
LINGER_SECONDS = 5
# What the bodies being received hold of the disk now (the reactor's thread alone counts).
on_disk = 0


class _Discard:
    """Where a refused request's body goes: nowhere."""

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args) -> int:
        return 0

    def read(self, *args) -> bytes:
        return b""

    def close(self) -> None:
        pass


class BoundedRequest(WebRequest):
    """Daphne's request, refused from its headers when its body is one no endpoint takes."""

    counted = 0
    refused = False
    # A body without a length is counted as it comes; one with a length, from its headers.
    counting_chunks = False

    def gotLength(self, length):
        self.counting_chunks = length is None
        if self._admitted(length or 0):
            super().gotLength(length)
            self.notifyFinish().addBoth(self._release)

    def handleContentChunk(self, data):
        if self.refused or (self.counting_chunks and not self._admitted(len(data))):
            return
        super().handleContentChunk(data)

    def process(self):
        if self.refused:  # its body is over: the client has read the answer by now, or never will
            self.channel.transport.loseConnection()
        else:
            super().process()

    def _admitted(self, size: int) -> bool:
        """Count `size` more bytes of this body, unless they make it one to refuse (then refuse it)."""
        global on_disk
        total = self.counted + size
        if total > settings.WEB_MAX_BODY_MIB * MIB:
            message = _("The request's body is larger than %(n)s MiB, more than any endpoint takes.")
            return self._refuse(413, "too_large", message, n=settings.WEB_MAX_BODY_MIB)
        if total > settings.API_MAX_BODY_BYTES and not self._has_credentials():
            message = _("A body this large needs credentials: an API key, a signed-in session or a token.")
            return self._refuse(401, "not_authenticated", message)
        if on_disk + size > settings.WEB_BODIES_ON_DISK_MIB * MIB:
            message = _("The server is receiving too much at once: try again in a moment.")
            return self._refuse(503, "busy", message)
        self.counted, on_disk = total, on_disk + size
        return True

    def _has_credentials(self) -> bool:
        headers = self.requestHeaders
        return (
            headers.hasHeader(b"authorization")
            or settings.SESSION_COOKIE_NAME.encode() in self.received_cookies
        )

    def _refuse(self, status: int, code: str, message, **params) -> bool:
        """Answer at once in the API's error shape, then drop the rest of the body as it comes, for
        LINGER_SECONDS at most: a connection closed with unread bytes is reset, and the reset would
        often destroy the answer before a client that is still sending reads it."""
        self.refused = True
        self.content = _Discard()
        self._release()
        self.requestHeaders.removeHeader(b"expect")  # no "100 Continue" after the answer
        from twisted.internet import reactor  # daphne's (importing it earlier would install another)

        reactor.callLater(LINGER_SECONDS, self.channel.transport.loseConnection)
        with translation.override(self._language()):
            body = json.dumps({"error": {"code": code, "message": str(message) % params}}).encode()
        retry = f"Retry-After: {RETRY_AFTER}\r\n" if status == 503 else ""
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n"
        )
        self.channel.transport.write(head.encode() + body)
        return False

    def _language(self) -> str:
        accepted = (self.getHeader(b"accept-language") or b"").decode("latin-1").split(",")
        for choice in (item.split(";")[0].strip() for item in accepted):
            try:
                return translation.get_supported_language_variant(choice)
            except LookupError:
                continue
        return settings.LANGUAGE_CODE

    def _release(self, *_ignored):
        global on_disk
        on_disk -= self.counted
        self.counted = 0


class SpoolingServer(Server):
    def __init__(self, application, *args, **kwargs):
        super().__init__(_reading_spooled(application), *args, **kwargs)

    def protocol_connected(self, protocol):
        # Daphne tells the server of each request as it is made, before its headers: the one place to
        # make it a request that checks its body before keeping it.
        if type(protocol) is WebRequest:
            protocol.__class__ = BoundedRequest
        super().protocol_connected(protocol)

    def create_application(self, protocol, scope):
        # Daphne fills the queue it returns with the whole body right after this, before the application runs.
        queue = super().create_application(protocol, scope)
        if queue is not None and scope.get("type") == "http":
            queue.put_nowait = _spooling(queue.put_nowait)
        return queue


# Linux's socket option (not in Python's socket module): bind to an address no interface has yet.
IP_FREEBIND = 15


class SpoolingCommandLine(CommandLineInterface):
    server_class = SpoolingServer

    def __init__(self):
        super().__init__()
        self.parser.add_argument(
            "--freebind",
            action="store_true",
            help="Listen on -b's address even before any interface has it (the desktops' bridge, which the "
            "engine makes when it first needs it): connections are taken from the moment it exists.",
        )

    def run(self, args):
        options, _unknown = self.parser.parse_known_args(args)
        if options.freebind:
            if not options.host or options.port is None:
                self.parser.error("--freebind listens on -b and -p: give both")
            args = _on_a_free_bound_socket(args, options.host, options.port)
        super().run(args)


def _on_a_free_bound_socket(args: list[str], host: str, port: int) -> list[str]:
    """The arguments, with -b and -p replaced by a socket on that address made with IP_FREEBIND
    (given to daphne as --fd: Twisted adopts the descriptor, and closes it when done)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
    listener.bind((host, port))
    listener.listen(socket.SOMAXCONN)
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-b", "--bind", "-p", "--port"):
            skip = True
        elif arg != "--freebind":
            kept.append(arg)
    return ["--fd", str(listener.detach()), *kept]


if __name__ == "__main__":
    SpoolingCommandLine.entrypoint()
