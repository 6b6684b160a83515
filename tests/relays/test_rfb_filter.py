"""The relay's RFB: the browser's handshake answered by the relay, then its messages policed, on byte
sequences noVNC really sends, however the network splits them."""

import asyncio
import struct

import pytest

from proxies.rfb import BrowserHandshake, ClientMessages, RfbViolation

FBUR = struct.pack(">BBHHHH", 3, 1, 0, 0, 640, 400)
KEY = struct.pack(">BBxxI", 4, 1, 0x74)
POINTER = struct.pack(">BBHH", 5, 1, 10, 10)
EXTENDED_CLIPBOARD_CAPS = bytes.fromhex("06000000fffffff81f00000100000000")
QEMU_KEY = struct.pack(">BBHII", 255, 0, 1, 0x74, 20)
FENCE = struct.pack(">BxxxIB", 248, 0, 1) + b"\x01"
SERVER_INIT = struct.pack(">HH16sI", 640, 400, bytes(16), 4) + b"desk"


def filtered(data: bytes, *, allow_input: bool, split: int | None = None) -> bytes:
    messages = ClientMessages(allow_input=allow_input)
    if split is None:
        return messages.feed(data)
    return b"".join(messages.feed(data[i : i + split]) for i in range(0, len(data), split))


@pytest.mark.parametrize("split", [None, 1, 3, 7])
def test_control_passes_everything_whatever_the_framing(split):
    data = EXTENDED_CLIPBOARD_CAPS + FBUR + KEY + POINTER + QEMU_KEY + FENCE
    assert filtered(data, allow_input=True, split=split) == data


@pytest.mark.parametrize("split", [None, 1, 5])
def test_view_drops_input_and_keeps_the_rest(split):
    data = EXTENDED_CLIPBOARD_CAPS + FBUR + KEY + POINTER + QEMU_KEY + FENCE
    assert filtered(data, allow_input=False, split=split) == FBUR + FENCE


def test_continuous_updates_are_never_offered_to_the_server():
    encodings = [0, -312, -313, 7]
    message = struct.pack(">BxH4i", 2, 4, *encodings)
    assert filtered(message, allow_input=True) == struct.pack(">BxH3i", 2, 3, 0, -312, 7)


def test_unknown_messages_and_huge_clipboards_are_refused():
    with pytest.raises(RfbViolation, match="type 99"):
        filtered(b"\x63", allow_input=True)
    with pytest.raises(RfbViolation, match="limit"):
        filtered(struct.pack(">BxxxI", 6, 50_000_000), allow_input=True)


def handshake(browser_bytes: bytes, split: int) -> tuple[bytes, bytes, bool]:
    """What the relay says to a browser sending these bytes, what it hands on after, and if it is done."""
    said = bytearray()

    async def send(data: bytes) -> None:
        said.extend(data)

    async def run():
        greeting = BrowserHandshake(send, SERVER_INIT)
        await greeting.start()
        rest = b""
        for i in range(0, len(browser_bytes), split):
            rest += await greeting.feed(browser_bytes[i : i + split])
        return rest, greeting.done

    rest, done = asyncio.run(run())
    return bytes(said), rest, done


@pytest.mark.parametrize("split", [1, 4, 100])
@pytest.mark.parametrize(
    ("browser", "relay"),
    [
        (b"RFB 003.008\n\x01\x01", b"RFB 003.008\n\x01\x01\x00\x00\x00\x00"),
        (b"RFB 003.007\n\x01\x01", b"RFB 003.008\n\x01\x01"),
        (b"RFB 003.003\n\x01", b"RFB 003.008\n\x00\x00\x00\x01"),
    ],
)
def test_the_relay_answers_each_rfb_version_as_a_server_without_authentication(browser, relay, split):
    said, rest, done = handshake(browser + FBUR, split)
    assert done and said == relay + SERVER_INIT and rest == FBUR


@pytest.mark.parametrize(
    ("browser", "why"),
    [(b"RFB 004.001\n", "version"), (b"RFB 003.008\n\x02", "security type 2")],
)
def test_a_handshake_the_relay_did_not_offer_is_refused(browser, why):
    with pytest.raises(RfbViolation, match=why):
        handshake(browser, 100)
