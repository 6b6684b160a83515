"""The simulator's VM console: ``vncwebsocket`` upgraded to a WebSocket carrying a tiny RFB server.

As on PVE, the WebSocket must ask for the ``binary`` subprotocol (pveproxy's checks), and the RFB
server (QEMU's, there) offers VNC authentication only, with the password ``vncproxy`` set, which
expires some seconds after. Behind it is a blank 800x600 screen that answers update requests.
"""

from __future__ import annotations

import secrets
import string
import struct
import time

from websockets.exceptions import ConnectionClosed
from websockets.server import ServerProtocol
from websockets.sync.connection import Connection

from desktops.rfb import vnc_auth_response

PRINTABLE = string.ascii_letters + string.digits + string.punctuation
RFB_VERSION = b"RFB 003.008\n"
VNC_AUTH = 2
WIDTH, HEIGHT = 800, 600
# 32 bits per pixel, depth 24, little-endian true colour, 8 bits each of red, green, blue.
PIXEL_FORMAT = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)


def refusal(headers) -> str | None:
    """pveproxy's objections to an upgrade request, in its words; None when it would upgrade."""
    if headers.get("Upgrade", "").lower() != "websocket":
        return f"unable to upgrade to protocol '{headers.get('Upgrade')}'"
    if headers.get("Sec-WebSocket-Version") != "13":
        return f"unsupported websocket-version '{headers.get('Sec-WebSocket-Version')}'"
    offered = headers.get("Sec-WebSocket-Protocol")
    if not offered:
        return "missing websocket-protocol header"
    if not {"binary", "base64"} & {p.strip() for p in offered.split(",")}:
        return f"unsupported websocket-protocol protocol '{offered}'"
    return None


def serve(handler, password: str, password_expires: float, name: str) -> None:
    """Upgrade the handler's connection and serve RFB on it until the client goes."""
    protocol = ServerProtocol(subprotocols=["binary"])
    # The handler has read the request already: hand it over as it came, so the protocol's parser
    # moves on to frames.
    head = [handler.requestline, *(f"{name}: {value}" for name, value in handler.headers.items())]
    protocol.receive_data("".join(f"{line}\r\n" for line in [*head, ""]).encode("latin-1"))
    (request,) = protocol.events_received()
    protocol.send_response(protocol.accept(request))
    handler.connection.sendall(b"".join(protocol.data_to_send()))
    websocket = Connection(handler.connection, protocol)
    try:
        _rfb(_Stream(websocket), password, password_expires, name)
    except ConnectionClosed:
        pass
    finally:
        websocket.close()


class _Stream:
    """Exact reads over WebSocket messages, whose boundaries RFB ignores."""

    def __init__(self, websocket: Connection):
        self.websocket = websocket
        self.buffer = bytearray()

    def read(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self.buffer += self.websocket.recv(decode=False)
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def send(self, data: bytes) -> None:
        self.websocket.send(data)


def _rfb(stream: _Stream, password: str, password_expires: float, name: str) -> None:
    stream.send(RFB_VERSION)
    if stream.read(12) != RFB_VERSION:
        return
    stream.send(bytes([1, VNC_AUTH]))
    if stream.read(1) != bytes([VNC_AUTH]):
        return
    challenge = secrets.token_bytes(16)
    stream.send(challenge)
    answer = stream.read(16)
    if time.time() > password_expires or answer != vnc_auth_response(password.encode("latin-1"), challenge):
        reason = b"Authentication failed"
        stream.send(struct.pack(">II", 1, len(reason)) + reason)
        return
    stream.send(struct.pack(">I", 0))
    stream.read(1)  # ClientInit
    title = name.encode()
    stream.send(struct.pack(">HH", WIDTH, HEIGHT) + PIXEL_FORMAT + struct.pack(">I", len(title)) + title)
    while True:
        kind = stream.read(1)[0]
        if kind == 0:  # SetPixelFormat
            stream.read(19)
        elif kind == 2:  # SetEncodings
            (count,) = struct.unpack(">xH", stream.read(3))
            stream.read(4 * count)
        elif kind == 3:  # FramebufferUpdateRequest: the area, raw and blank
            _, x, y, w, h = struct.unpack(">BHHHH", stream.read(9))
            rectangle = struct.pack(">HHHHi", x, y, w, h, 0) + bytes(w * h * 4)
            stream.send(struct.pack(">BxH", 0, 1) + rectangle)
        elif kind == 4:  # KeyEvent
            stream.read(7)
        elif kind == 5:  # PointerEvent
            stream.read(5)
        elif kind == 6:  # ClientCutText
            (length,) = struct.unpack(">3xI", stream.read(7))
            stream.read(length)
        else:
            return
