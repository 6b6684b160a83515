"""A minimal RFB 3.8 client for tests: is there a session drawn on a desktop's screen?

Desktops' VNC servers ask for VNC authentication with the desktop's own password
(``desktops.guest.vnc_password``); pass it, or None for a server that asks for none.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import Counter

from desktops.guest import vnc_des


def wait_for_a_drawn_screen(
    ip: str, password: bytes | None, port: int = 5900, timeout: float = 30
) -> tuple[int, int, float, int]:
    """(width, height, share of pixels off the background, colours) once a window is on screen.

    VNC answers as soon as Xvnc listens; the session's windows follow within a few seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        width, height, pixels = grab_framebuffer(ip, password, port)
        colours = Counter(pixels[i : i + 4] for i in range(0, len(pixels), 4))
        drawn = 1 - colours.most_common(1)[0][1] / (width * height)
        # A blank screen (or one with only the pointer on it) is one colour; a terminal covers a lot.
        if (drawn > 0.05 and len(colours) >= 16) or time.monotonic() > deadline:
            return width, height, drawn, len(colours)
        time.sleep(0.5)


def _connect(ip: str, port: int):
    conn = socket.create_connection((ip, port), timeout=10)
    conn.settimeout(10)

    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the VNC server closed the connection")
            data += chunk
        return data

    return conn, read


def _handshake(conn: socket.socket, read, password: bytes | None) -> tuple[int, int, str]:
    """Version, security and initialisation: the screen's width, height and desktop name."""
    version = read(12)
    assert version.startswith(b"RFB 003.00"), version
    conn.sendall(b"RFB 003.008\n")
    types = read(read(1)[0])
    wanted = 2 if password is not None else 1
    assert wanted in types, f"security type {wanted} not offered: {list(types)}"
    conn.sendall(bytes([wanted]))
    if password is not None:
        conn.sendall(vnc_des(password, read(16)))
    assert struct.unpack(">I", read(4))[0] == 0, "security handshake failed"
    conn.sendall(b"\x01")  # ClientInit: shared, so the operator's viewer stays connected
    width, height = struct.unpack(">HH", read(4))
    read(16)  # the server's pixel format
    return width, height, read(struct.unpack(">I", read(4))[0]).decode()


def desktop_name(ip: str, password: bytes | None, port: int = 5900) -> str:
    """The name the VNC server gives its desktop (a viewer's title)."""
    conn, read = _connect(ip, port)
    with conn:
        return _handshake(conn, read, password)[2]


def grab_framebuffer(ip: str, password: bytes | None, port: int = 5900) -> tuple[int, int, bytes]:
    """A minimal RFB 3.8 client: VNC authentication or none, 32-bit true colour, one Raw update."""
    conn, read = _connect(ip, port)
    with conn:
        width, height, _ = _handshake(conn, read, password)
        pixel_format = struct.pack(">BBBBHHHBBBxxx", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
        conn.sendall(b"\x00xxx" + pixel_format)  # SetPixelFormat
        conn.sendall(struct.pack(">BxHi", 2, 1, 0))  # SetEncodings: Raw only
        conn.sendall(struct.pack(">BBHHHH", 3, 0, 0, 0, width, height))  # FramebufferUpdateRequest
        framebuffer = bytearray(width * height * 4)
        message_type = read(1)[0]
        assert message_type == 0, f"expected a FramebufferUpdate, got message type {message_type}"
        read(1)
        for _ in range(struct.unpack(">H", read(2))[0]):
            x, y, w, h, encoding = struct.unpack(">HHHHi", read(12))
            assert encoding == 0, f"expected Raw encoding, got {encoding}"
            data = read(w * h * 4)
            for row in range(h):
                start = ((y + row) * width + x) * 4
                framebuffer[start : start + w * 4] = data[row * w * 4 : (row + 1) * w * 4]
        return width, height, bytes(framebuffer)
