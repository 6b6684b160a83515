"""RFB (VNC) as the relay speaks it: a client to the desktop's server, a server to the browser.

The relay never passes the handshake through. It authenticates to the desktop's VNC server itself
(``desktops.rfb.server_handshake``: VNC authentication with the desktop's own password, which the
browser never sees), then greets the browser as a server that asks for none (``BrowserHandshake``), in
whatever RFB version the browser picked, and replays the desktop's ServerInit. From then on it parses every
message the browser sends (``ClientMessages``) and forwards only the ones it knows and allows: a
view-only session's input (keys, pointer, clipboard, resizing) never reaches the desktop, whatever
bytes the browser sends, because the relay, not the browser, knows where each message starts.

It also keeps the server out of "continuous updates" mode, so that every framebuffer update answers
a request from the browser: a slow browser asks less often and the relay never piles up screen data.
"""

from __future__ import annotations

import struct

from desktops.rfb import NO_AUTH, RFB_38, Send

# What browsers announce: 3.3 (RFC 6143 §7.1.1 treats anything below 3.7, such as 3.5, as 3.3), 3.7, 3.8.
BROWSER_VERSIONS = {b"RFB 003.003\n": 3, b"RFB 003.005\n": 3, b"RFB 003.007\n": 7, RFB_38: 8}

# Client-to-server message types (RFC 6143 §7.5 and the community extensions noVNC speaks).
SET_PIXEL_FORMAT, SET_ENCODINGS, UPDATE_REQUEST, KEY, POINTER, CUT_TEXT = 0, 2, 3, 4, 5, 6
ENABLE_CONTINUOUS_UPDATES, CLIENT_FENCE, SET_DESKTOP_SIZE, QEMU = 150, 248, 251, 255
INPUT = {KEY, POINTER, CUT_TEXT, SET_DESKTOP_SIZE, QEMU}
CONTINUOUS_UPDATES_ENCODING = -313
# The relay holds at most one message in memory: bound the only one whose size the browser picks.
MAX_CUT_TEXT = 1024 * 1024


class RfbViolation(Exception):
    """The browser sent something that is not RFB as the relay knows it."""


class BrowserHandshake:
    """The relay as a server to the browser: no authentication, then the desktop's ServerInit.

    Feed it the browser's bytes; it answers through ``send`` and, once the browser has sent its
    ClientInit, is ``done`` and hands back what the browser sent beyond it.
    """

    def __init__(self, send: Send, server_init: bytes):
        self.send, self.server_init = send, server_init
        self.buffer = bytearray()
        self.stage = "version"
        self.version = 0
        self.done = False

    async def start(self) -> None:
        await self.send(RFB_38)

    async def feed(self, data: bytes) -> bytes:
        self.buffer += data
        while not self.done:
            needed = 12 if self.stage == "version" else 1
            if len(self.buffer) < needed:
                return b""
            chunk = bytes(self.buffer[:needed])
            del self.buffer[:needed]
            await self._step(chunk)
        rest = bytes(self.buffer)
        self.buffer.clear()
        return rest

    async def _step(self, chunk: bytes) -> None:
        if self.stage == "version":
            self.version = BROWSER_VERSIONS.get(chunk, 0)
            if not self.version:
                raise RfbViolation(f"RFB version {chunk!r} is not one the relay speaks")
            if self.version == 3:
                # RFB 3.3: the server decides the security type, and None needs no result.
                await self.send(struct.pack(">I", NO_AUTH))
                self.stage = "client-init"
            else:
                await self.send(bytes([1, NO_AUTH]))
                self.stage = "security"
        elif self.stage == "security":
            if chunk[0] != NO_AUTH:
                raise RfbViolation(f"security type {chunk[0]} was not offered")
            if self.version == 8:  # only 3.8 confirms a handshake without authentication
                await self.send(struct.pack(">I", 0))
            self.stage = "client-init"
        else:
            # ClientInit's shared flag is the relay's to choose towards the server: always shared.
            await self.send(self.server_init)
            self.done = True


def _message_length(buffer: bytes | bytearray) -> int | None:
    """Length of the message at the start of `buffer`, or None if more bytes are needed."""
    kind = buffer[0]
    fixed = {SET_PIXEL_FORMAT: 20, UPDATE_REQUEST: 10, KEY: 8, POINTER: 6, ENABLE_CONTINUOUS_UPDATES: 10}
    if kind in fixed:
        return fixed[kind]
    if kind == SET_ENCODINGS:
        return None if len(buffer) < 4 else 4 + 4 * struct.unpack_from(">H", buffer, 2)[0]
    if kind == CUT_TEXT:
        if len(buffer) < 8:
            return None
        # A negative length announces the extended clipboard format: its payload is -length bytes.
        payload = abs(struct.unpack_from(">i", buffer, 4)[0])
        if payload > MAX_CUT_TEXT:
            raise RfbViolation(f"clipboard text of {payload} bytes is over the {MAX_CUT_TEXT} limit")
        return 8 + payload
    if kind == CLIENT_FENCE:
        return None if len(buffer) < 9 else 9 + buffer[8]
    if kind == SET_DESKTOP_SIZE:
        return None if len(buffer) < 8 else 8 + 16 * buffer[6]
    if kind == QEMU:
        if len(buffer) < 2:
            return None
        sub_lengths = {0: 12, 1: 4}  # extended key event; audio (a 2-byte op follows, 4 in all)
        if buffer[1] not in sub_lengths:
            raise RfbViolation(f"unknown QEMU message {buffer[1]}")
        return sub_lengths[buffer[1]]
    raise RfbViolation(f"unknown client message type {kind}")


class ClientMessages:
    """The browser's messages after the handshake: feed it bytes, it returns what may go to the server."""

    def __init__(self, *, allow_input: bool):
        self.allow_input = allow_input
        self.buffer = bytearray()

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out = bytearray()
        while self.buffer:
            length = _message_length(self.buffer)
            if length is None or len(self.buffer) < length:
                break
            message = bytes(self.buffer[:length])
            del self.buffer[:length]
            out += self._police(message)
        return bytes(out)

    def _police(self, message: bytes) -> bytes:
        kind = message[0]
        if kind in INPUT and not self.allow_input:
            return b""
        if kind == SET_ENCODINGS:
            count = struct.unpack_from(">H", message, 2)[0]
            encodings = struct.unpack_from(f">{count}i", message, 4)
            kept = [e for e in encodings if e != CONTINUOUS_UPDATES_ENCODING]
            return struct.pack(f">BxH{len(kept)}i", SET_ENCODINGS, len(kept), *kept)
        return message
