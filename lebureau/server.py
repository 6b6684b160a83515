"""The web server of every listener (pages and API, guest endpoint): daphne, except that a request's body
waits on disk, not in memory, until the application reads it.

Twisted collects a body in a temporary file, then daphne reads all of it into the application's queue
at once: one anonymous 8 GiB PUT became 8 GiB of the web server's memory before authentication or any
size check ran. Here a request keeps at most BODY_IN_MEMORY bytes of its body in that queue; the rest
stays in a temporary file of its own, read back chunk by chunk as the application asks (Django then
spools it to disk past FILE_UPLOAD_MAX_MEMORY_SIZE, and refuses what is too large for the endpoint).

    python -m lebureau.server -b 127.0.0.1 -p 8000 lebureau.asgi:application   (daphne's options)
"""

from __future__ import annotations

import os
import tempfile

from daphne.cli import CommandLineInterface
from daphne.server import Server

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


class SpoolingServer(Server):
    def __init__(self, application, *args, **kwargs):
        super().__init__(_reading_spooled(application), *args, **kwargs)

    def create_application(self, protocol, scope):
        # Daphne fills the queue it returns with the whole body right after this, before the application runs.
        queue = super().create_application(protocol, scope)
        if queue is not None and scope.get("type") == "http":
            queue.put_nowait = _spooling(queue.put_nowait)
        return queue


class SpoolingCommandLine(CommandLineInterface):
    server_class = SpoolingServer


if __name__ == "__main__":
    SpoolingCommandLine.entrypoint()
