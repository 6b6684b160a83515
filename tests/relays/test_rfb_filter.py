"""The RFB client-stream filter on byte sequences noVNC really sends."""

import struct

import pytest

from proxies.rfb import ClientStreamFilter, RfbViolation

HANDSHAKE = b"RFB 003.008\n" + b"\x01" + b"\x01"
FBUR = struct.pack(">BBHHHH", 3, 1, 0, 0, 640, 400)
KEY = struct.pack(">BBxxI", 4, 1, 0x74)
POINTER = struct.pack(">BBHH", 5, 1, 10, 10)
EXTENDED_CLIPBOARD_CAPS = bytes.fromhex("06000000fffffff81f00000100000000")
QEMU_KEY = struct.pack(">BBHII", 255, 0, 1, 0x74, 20)
FENCE = struct.pack(">BxxxIB", 248, 0, 1) + b"\x01"


def filtered(data: bytes, *, allow_input: bool, split: int | None = None) -> bytes:
    stream = ClientStreamFilter(allow_input=allow_input)
    if split is None:
        return stream.feed(data)
    return b"".join(stream.feed(data[i : i + split]) for i in range(0, len(data), split))


@pytest.mark.parametrize("split", [None, 1, 3, 7])
def test_control_passes_everything_whatever_the_framing(split):
    data = HANDSHAKE + EXTENDED_CLIPBOARD_CAPS + FBUR + KEY + POINTER + QEMU_KEY + FENCE
    assert filtered(data, allow_input=True, split=split) == data


@pytest.mark.parametrize("split", [None, 1, 5])
def test_view_drops_input_and_keeps_the_rest(split):
    data = HANDSHAKE + EXTENDED_CLIPBOARD_CAPS + FBUR + KEY + POINTER + QEMU_KEY + FENCE
    assert filtered(data, allow_input=False, split=split) == HANDSHAKE + FBUR + FENCE


def test_continuous_updates_are_never_offered_to_the_server():
    encodings = [0, -312, -313, 7]
    message = struct.pack(">BxH4i", 2, 4, *encodings)
    out = filtered(HANDSHAKE + message, allow_input=True)[len(HANDSHAKE) :]
    assert out == struct.pack(">BxH3i", 2, 3, 0, -312, 7)


def test_vnc_auth_handshake_is_passed_through():
    data = b"RFB 003.008\n" + b"\x02" + bytes(16) + b"\x01" + FBUR
    assert filtered(data, allow_input=False) == data


def test_unknown_messages_and_huge_clipboards_are_refused():
    with pytest.raises(RfbViolation, match="type 99"):
        filtered(HANDSHAKE + b"\x63", allow_input=True)
    with pytest.raises(RfbViolation, match="limit"):
        filtered(HANDSHAKE + struct.pack(">BxxxI", 6, 50_000_000), allow_input=True)
