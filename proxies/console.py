"""The VNC relay's fallback: the VM's emulated display through its engine, when the guest's VNC is down.

With Proxmox that is ``vncwebsocket``: a WebSocket (subprotocol ``binary``) carrying the RFB stream
of QEMU's own VNC server, which ``vncproxy`` put behind VNC authentication with a one-time password.

The relay answers that authentication itself and then shows the browser a server that asks for
none, exactly like the guest's own: the page needs no password prompt, and the password, good for
anyone who reaches the socket in the next seconds, never leaves the control plane. Passing the
security handshake through instead would hand it to the browser.

No Django here: the PVE simulator in the tests checks answers with :func:`vnc_auth_response`.
"""

from __future__ import annotations

import ssl
import struct
from collections.abc import Awaitable, Callable

from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
from cryptography.hazmat.primitives.ciphers import Cipher, modes
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from desktops.engines import ConsoleTicket
from proxies.rfb import RfbViolation

RFB_VERSION = b"RFB 003.008\n"
NO_AUTH, VNC_AUTH = 1, 2

Send = Callable[[bytes], Awaitable[None]]


class ConsoleRefused(Exception):
    """The engine's console turned the relay away (bad or expired ticket or password)."""


def vnc_auth_response(password: str, challenge: bytes) -> bytes:
    """RFB's VNC authentication (RFC 6143 §7.2.2): the 16-byte challenge DES-encrypted with the password.

    The key is the password's first eight bytes, each with its bits in reverse order: a quirk of the
    first implementation that every server kept.
    """
    key = bytes(int(f"{b:08b}"[::-1], 2) for b in password.encode("latin-1")[:8].ljust(8, b"\0"))
    # The same key three times makes triple DES plain DES.
    encryptor = Cipher(TripleDES(key * 3), modes.ECB()).encryptor()  # noqa: S305 (the protocol's choice)
    return encryptor.update(challenge) + encryptor.finalize()


class RfbReader:
    """Exact reads over a stream of chunks (WebSocket messages, TCP reads) whose boundaries RFB ignores."""

    def __init__(self, next_chunk: Callable[[], Awaitable[bytes]]):
        self.next_chunk = next_chunk
        self.buffer = bytearray()

    async def read(self, size: int) -> bytes:
        while len(self.buffer) < size:
            chunk = await self.next_chunk()
            if not chunk:
                raise ConsoleRefused("the console closed during the RFB handshake")
            self.buffer += chunk
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def rest(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


async def vnc_authenticate(reader: RfbReader, send: Send, password: str) -> None:
    """Take an RFB 3.8 server through VNC authentication, up to where it waits for ClientInit."""
    version = await reader.read(12)
    if not version.startswith(b"RFB 003.") or version < RFB_VERSION:
        raise ConsoleRefused(f"the console speaks {version!r}, not RFB 3.8")
    await send(RFB_VERSION)
    count = (await reader.read(1))[0]
    if count == 0:
        raise ConsoleRefused(await _failure_reason(reader))
    offered = await reader.read(count)
    if VNC_AUTH not in offered:
        raise ConsoleRefused(f"the console does not offer VNC authentication (offers {list(offered)})")
    await send(bytes([VNC_AUTH]))
    await send(vnc_auth_response(password, await reader.read(16)))
    (result,) = struct.unpack(">I", await reader.read(4))
    if result != 0:
        raise ConsoleRefused(await _failure_reason(reader))


async def _failure_reason(reader: RfbReader) -> str:
    (length,) = struct.unpack(">I", await reader.read(4))
    return (await reader.read(min(length, 1024))).decode("utf-8", "replace")


class ConsoleScreen:
    """The relay's screen when it is the engine's console: the same calls as the guest's VNC server."""

    def __init__(self, websocket: ClientConnection, leftover: bytes, to_browser: Send):
        self.websocket = websocket
        self.leftover = leftover
        self.to_browser = to_browser
        # The browser's side of the handshake, which the relay answers itself.
        self.stage = "version"
        self.version = b""
        self.pending = bytearray()

    @classmethod
    async def open(cls, ticket: ConsoleTicket, to_browser: Send) -> ConsoleScreen:
        """Connect and authenticate, then greet the browser.

        Raises ConsoleRefused when turned away, OSError, TimeoutError or InvalidHandshake otherwise.
        """
        try:
            websocket = await connect(
                ticket.url,
                additional_headers=ticket.headers,
                subprotocols=["binary"],
                ssl=_tls(ticket.verify),
                compression=None,
                open_timeout=10,
            )
        except InvalidStatus as exc:
            response = exc.response
            raise ConsoleRefused(f"HTTP {response.status_code} {response.reason_phrase}") from exc
        try:
            reader = RfbReader(lambda: _receive(websocket))
            await vnc_authenticate(reader, websocket.send, ticket.password)
        except BaseException:
            await websocket.close()
            raise
        screen = cls(websocket, reader.rest(), to_browser)
        await to_browser(RFB_VERSION)
        return screen

    async def next_chunk(self) -> bytes:
        """What the console sent next; empty once it is closed."""
        if self.leftover:
            data, self.leftover = self.leftover, b""
            return data
        return await _receive(self.websocket)

    async def write(self, data: bytes) -> None:
        """The browser's bytes: its handshake is answered here, the rest goes to the console."""
        if self.stage == "messages":
            await self.websocket.send(data)
            return
        self.pending += data
        if self.stage == "version" and len(self.pending) >= 12:
            self.version = bytes(self.pending[:12])
            del self.pending[:12]
            if self.version not in (b"RFB 003.007\n", RFB_VERSION):
                raise RfbViolation(f"RFB version {self.version!r} is not 3.7 or 3.8")
            self.stage = "security"
            await self.to_browser(bytes([1, NO_AUTH]))
        if self.stage == "security" and self.pending:
            if self.pending[0] != NO_AUTH:
                raise RfbViolation(f"security type {self.pending[0]} was not offered")
            del self.pending[:1]
            self.stage = "messages"
            if self.version == RFB_VERSION:  # only 3.8 confirms a handshake without authentication
                await self.to_browser(struct.pack(">I", 0))
        if self.stage == "messages" and self.pending:
            await self.websocket.send(bytes(self.pending))
            self.pending.clear()

    async def close(self) -> None:
        await self.websocket.close()


async def _receive(websocket: ClientConnection) -> bytes:
    try:
        data = await websocket.recv(decode=False)
    except ConnectionClosed:
        return b""
    # An empty message is not the end of the stream.
    return data or await _receive(websocket)


def _tls(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
