"""Parses the browser's side of an RFB (VNC) stream so the relay can police it.

The relay needs message boundaries to (1) drop input in view-only sessions and
(2) keep the server out of "continuous updates" mode, so that every framebuffer
update answers a request from the browser: a slow browser asks less often and
the relay never piles up screen data for it.
"""

from __future__ import annotations

import struct

# Client-to-server message types (RFC 6143 §7.5 and the community extensions noVNC speaks).
SET_PIXEL_FORMAT, SET_ENCODINGS, UPDATE_REQUEST, KEY, POINTER, CUT_TEXT = 0, 2, 3, 4, 5, 6
ENABLE_CONTINUOUS_UPDATES, CLIENT_FENCE, SET_DESKTOP_SIZE, QEMU = 150, 248, 251, 255
INPUT = {KEY, POINTER, CUT_TEXT, SET_DESKTOP_SIZE, QEMU}
CONTINUOUS_UPDATES_ENCODING = -313
# The relay holds at most one message in memory: bound the only one whose size the browser picks.
MAX_CUT_TEXT = 1024 * 1024


class RfbViolation(Exception):
    """The browser sent something that is not RFB as the relay knows it."""


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


class ClientStreamFilter:
    """Feed it the browser's bytes; it returns what may go on to the VNC server."""

    def __init__(self, *, allow_input: bool):
        self.allow_input = allow_input
        self.buffer = bytearray()
        self.stage = "version"

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out = bytearray()
        while self.buffer:
            if self.stage != "messages":
                if not self._handshake(out):
                    break
                continue
            length = _message_length(self.buffer)
            if length is None or len(self.buffer) < length:
                break
            message = bytes(self.buffer[:length])
            del self.buffer[:length]
            out += self._police(message)
        return bytes(out)

    def _handshake(self, out: bytearray) -> bool:
        needed = {"version": 12, "security": 1, "vnc-auth": 16, "client-init": 1}[self.stage]
        if len(self.buffer) < needed:
            return False
        chunk = bytes(self.buffer[:needed])
        del self.buffer[:needed]
        out += chunk
        if self.stage == "version":
            self.stage = "security"
        elif self.stage == "security":
            self.stage = "vnc-auth" if chunk[0] == 2 else "client-init"
        elif self.stage == "vnc-auth":
            self.stage = "client-init"
        else:
            self.stage = "messages"
        return True

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
