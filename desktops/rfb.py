"""RFB (VNC) as the control plane speaks it to a desktop's screen: the way there, and the client's handshake.

A desktop's screen is reached at its own VNC server over TCP or, when that does not answer, through
its engine's console (with Proxmox, ``vncwebsocket``: a WebSocket, subprotocol ``binary``, carrying
the RFB stream of QEMU's own VNC server behind a one-time password from ``vncproxy``). Either way the
control plane authenticates itself (``server_handshake``) with a password no browser ever sees. The
screen relay (``proxies``) and the screen API (``desktops.screen``) both start here.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from channels.db import database_sync_to_async
from django.conf import settings
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from desktops.engines import ConsoleTicket, desktop_console
from desktops.errors import Unavailable
from desktops.guest import vnc_des, vnc_password

RFB_38 = b"RFB 003.008\n"
NO_AUTH, VNC_AUTH = 1, 2
# A desktop's name in ServerInit is shown, not trusted: keep it short.
MAX_NAME = 4096
# A console may send a whole screen's update as one WebSocket message: a 4K screen, uncompressed.
MAX_CONSOLE_MESSAGE = 3840 * 2160 * 4

Send = Callable[[bytes], Awaitable[None]]


class ServerRefused(Exception):
    """The desktop's VNC server (or the engine's console) turned the control plane away."""


class ScreenUnreachable(Exception):
    """Neither the desktop's VNC server nor its engine's console answers."""


def vnc_auth_response(password: bytes, challenge: bytes) -> bytes:
    """RFB's VNC authentication (RFC 6143 §7.2.2): the 16-byte challenge DES-encrypted with the password."""
    return vnc_des(password, challenge)


class RfbReader:
    """Exact reads over a stream of chunks (WebSocket messages, TCP reads) whose boundaries RFB ignores."""

    def __init__(self, next_chunk: Callable[[], Awaitable[bytes]]):
        self.next_chunk = next_chunk
        # What is read is passed over (`start`), and dropped only when more must come: dropping it at
        # each read would move the rest of a large chunk each time, thousands of times a chunk.
        self.buffer = bytearray()
        self.start = 0

    async def read(self, size: int) -> bytes:
        while len(self.buffer) - self.start < size:
            chunk = await self.next_chunk()
            if not chunk:
                raise ServerRefused("the server closed the RFB stream")
            del self.buffer[: self.start]
            self.start = 0
            self.buffer += chunk
        data = bytes(self.buffer[self.start : self.start + size])
        self.start += size
        return data

    async def read_into(self, view: memoryview) -> None:
        """Fill `view` (a large rectangle's pixels) without building it up in a bytes object first."""
        filled = min(len(view), len(self.buffer) - self.start)
        view[:filled] = self.buffer[self.start : self.start + filled]
        del self.buffer[: self.start + filled]
        self.start = 0
        while filled < len(view):
            chunk = await self.next_chunk()
            if not chunk:
                raise ServerRefused("the server closed the RFB stream")
            used = min(len(chunk), len(view) - filled)
            view[filled : filled + used] = chunk[:used]
            filled += used
            self.buffer += chunk[used:]

    def rest(self) -> bytes:
        data = bytes(self.buffer[self.start :])
        self.buffer.clear()
        self.start = 0
        return data


async def vnc_authenticate(reader: RfbReader, send: Send, password: bytes | None) -> None:
    """Take an RFB 3.8 server through its security handshake, up to where it waits for ClientInit.

    With a password, VNC authentication is used; a server that offers none is taken as it is (a
    desktop made before desktops had their own VNC password, whose screen is still its own).
    """
    version = await reader.read(12)
    if not version.startswith(b"RFB 003.") or version < RFB_38:
        raise ServerRefused(f"the server speaks {version!r}, not RFB 3.8")
    await send(RFB_38)
    count = (await reader.read(1))[0]
    if count == 0:
        raise ServerRefused(await _failure_reason(reader))
    offered = await reader.read(count)
    wanted = VNC_AUTH if password is not None and VNC_AUTH in offered else NO_AUTH
    if wanted not in offered:
        raise ServerRefused(f"the server offers security types {list(offered)}, not {wanted}")
    await send(bytes([wanted]))
    if wanted == VNC_AUTH:
        await send(vnc_auth_response(password, await reader.read(16)))
    (result,) = struct.unpack(">I", await reader.read(4))
    if result != 0:
        raise ServerRefused(await _failure_reason(reader))


async def server_handshake(reader: RfbReader, send: Send, password: bytes | None) -> bytes:
    """Authenticate, share the desktop (ClientInit), and return its ServerInit message as it came."""
    await vnc_authenticate(reader, send, password)
    await send(b"\x01")  # shared: other viewers of the same desktop stay connected
    head = await reader.read(24)
    (name_length,) = struct.unpack_from(">I", head, 20)
    if name_length > MAX_NAME:
        raise ServerRefused(f"the server's name is {name_length} bytes long")
    return head + await reader.read(name_length)


async def _failure_reason(reader: RfbReader) -> str:
    (length,) = struct.unpack(">I", await reader.read(4))
    return (await reader.read(min(length, 1024))).decode("utf-8", "replace")


class ScreenStream(Protocol):
    async def next_chunk(self) -> bytes: ...
    async def write(self, data: bytes) -> None: ...
    async def close(self) -> None: ...


class DesktopVnc(asyncio.Protocol):
    """A desktop's own VNC server over TCP: hands each chunk the kernel gives over as it is, without
    the copies of a stream reader, and stops reading while the reading side is behind."""

    MAX_QUEUED = 4

    def __init__(self):
        self.chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.chunks.put_nowait(data)
        if self.chunks.qsize() >= self.MAX_QUEUED:
            self.transport.pause_reading()

    def connection_lost(self, exc):
        self.chunks.put_nowait(b"")

    async def next_chunk(self) -> bytes:
        data = await self.chunks.get()
        if self.chunks.qsize() < self.MAX_QUEUED and not self.transport.is_closing():
            self.transport.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def close(self) -> None:
        self.transport.close()


class ConsoleStream:
    """The engine's console's RFB bytes, read and written like a desktop's own VNC server."""

    def __init__(self, websocket: ClientConnection):
        self.websocket = websocket

    @classmethod
    async def open(cls, ticket: ConsoleTicket) -> ConsoleStream:
        """Raises ServerRefused when turned away, OSError, TimeoutError or InvalidHandshake otherwise."""
        try:
            websocket = await connect(
                ticket.url,
                additional_headers=ticket.headers,
                subprotocols=["binary"],
                ssl=_tls(ticket.verify),
                compression=None,
                open_timeout=10,
                max_size=MAX_CONSOLE_MESSAGE,
            )
        except InvalidStatus as exc:
            response = exc.response
            raise ServerRefused(f"HTTP {response.status_code} {response.reason_phrase}") from exc
        return cls(websocket)

    async def next_chunk(self) -> bytes:
        """What the console sent next; empty once it is closed."""
        while True:
            try:
                data = await self.websocket.recv(decode=False)
            except ConnectionClosed:
                return b""
            if data:  # an empty message is not the end of the stream
                return data

    async def write(self, data: bytes) -> None:
        await self.websocket.send(data)

    async def close(self) -> None:
        await self.websocket.close()


def _tls(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)


@dataclass(frozen=True)
class ScreenLink:
    """An open way to a desktop's screen, before the RFB handshake, and the password it takes."""

    stream: ScreenStream
    password: bytes | None
    console: bool  # through the engine's console, the desktop's own VNC server not answering


async def screen_link_open(*, desktop_id: str, host: str, mode: str) -> ScreenLink:
    """The desktop's own VNC server, in `mode` (its view-only password makes the server itself refuse
    input), or its engine's console. Raises ServerRefused or ScreenUnreachable."""
    loop = asyncio.get_running_loop()
    try:
        _transport, vnc = await asyncio.wait_for(
            loop.create_connection(DesktopVnc, host, settings.DESKTOP_VNC_PORT), timeout=5
        )
        return ScreenLink(vnc, vnc_password(desktop_id, mode), console=False)
    except (OSError, TimeoutError):
        pass
    try:
        # Not the shared sync thread: the engine may take a while to answer.
        ticket = await database_sync_to_async(desktop_console, thread_sensitive=False)(desktop_id=desktop_id)
        return ScreenLink(await ConsoleStream.open(ticket), ticket.password.encode("latin-1"), console=True)
    except (Unavailable, OSError, TimeoutError, InvalidHandshake) as exc:
        # Engines without a console of their own (LXC) end here too.
        raise ScreenUnreachable(str(exc)) from exc
