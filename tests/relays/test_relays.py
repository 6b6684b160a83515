"""The VNC and terminal relays with WebsocketCommunicator, against a real Xvnc and a real sshd.

The attacks a viewer, a tenant or a stolen ticket could try are here, each failing: a ticket used
twice or from another session, input slipped past the screen relay by desynchronising its RFB
handshake, relays that outlive their API key or their user, terminals that stall everyone's.
"""

import asyncio
import json
import os
import socket
import struct
import subprocess
import threading
import time
import zlib

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from desktops import services
from desktops.audit import Actor
from desktops.guest import control_plane_public_key, vnc_password, vnc_password_file
from desktops.models import ApiKey, DesktopState, Membership, RelayTicket, Role
from desktops.rfb import vnc_auth_response
from tests.conftest import wait_for_idle_lifecycle_worker
from tests.factories import DesktopFactory, MembershipFactory
from tests.support import services as real
from tests.support.relays import closed_with, mint, open_relay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_stray_connections")]

# The screen tests' desktop: its id fixes the VNC passwords the server is started with.
SCREEN_DESKTOP = "dsk_relaytestscreen0"


@pytest.fixture(scope="module")
def vnc_server(tmp_path_factory):
    passwords = tmp_path_factory.mktemp("vnc") / "passwd"
    passwords.write_bytes(vnc_password_file(SCREEN_DESKTOP))
    with real.xvnc(password_file=passwords) as server:
        yield server


@pytest.fixture
def relay_settings(settings, vnc_server):
    settings.DESKTOP_VNC_PORT = vnc_server[1]
    settings.DESKTOP_SSH_USER = "root"
    return settings


@pytest.fixture
def ssh_server(relay_settings, tmp_path):
    with real.sshd(tmp_path, control_plane_public_key()) as port:
        relay_settings.DESKTOP_SSH_PORT = port
        yield port


@pytest.fixture(scope="module", autouse=True)
def terminal_session():
    """The terminals' shared session outlives them, as in a desktop: this module's tests share one,
    found by none before them and left to none after (ended once its shell is idle)."""
    real.terminal_sessions_end()
    yield
    real.terminal_sessions_end()


@pytest.fixture
def desktop(relay_settings, plan):
    return DesktopFactory(id=SCREEN_DESKTOP, state=DesktopState.RUNNING, private_ip="127.0.0.1")


@pytest.fixture
def member(desktop):
    return MembershipFactory(workspace=desktop.workspace, role=Role.MEMBER)


async def relay_for(member, desktop, kind="vnc", mode="control", *, to=None, **options):
    """A relay opened with a fresh ticket of the member's for `desktop` (or to another desktop)."""
    tickets = await sync_to_async(mint)(member, desktop, mode)
    return await open_relay((to or desktop).id, kind, getattr(tickets, kind), **options)


async def type_in(communicator, text: str):
    await communicator.send_to(text_data=json.dumps({"type": "input", "data": text}))


# Tickets: every bad one closes the socket before a byte reaches the desktop


@pytest.mark.parametrize("kind", ["vnc", "terminal"])
async def test_no_ticket(desktop, kind):
    code, reason = await closed_with(await open_relay(desktop.id, kind, None))
    assert code == 4401 and "required" in reason


async def test_forged_ticket(desktop):
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", "forged-ticket"))
    assert code == 4401 and "not valid" in reason


async def test_a_ticket_opens_one_relay_only(desktop, member):
    """The old tokens opened any number of relays for a minute; a ticket opens exactly one."""
    tickets = await sync_to_async(mint)(member, desktop)
    first = await open_relay(desktop.id, "vnc", tickets.vnc)
    assert (await first.receive_from(timeout=5)).startswith(b"RFB 003.008")
    for _ in range(4):
        code, reason = await closed_with(await open_relay(desktop.id, "vnc", tickets.vnc))
        assert code == 4401 and "used already" in reason
    await first.disconnect()


async def test_a_ticket_opens_only_its_own_kind_of_relay(desktop, member):
    tickets = await sync_to_async(mint)(member, desktop)
    code, _ = await closed_with(await open_relay(desktop.id, "terminal", tickets.vnc))
    assert code == 4401


async def test_a_ticket_from_another_browser_session_is_refused(desktop, member):
    tickets = await sync_to_async(mint)(member, desktop, session="the-owners-session")
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", tickets.vnc, session="a-thief"))
    assert code == 4401 and "another session" in reason


async def test_expired_ticket(desktop, member, relay_settings):
    relay_settings.RELAY_TOKEN_MAX_AGE = 1
    tickets = await sync_to_async(mint)(member, desktop)
    await asyncio.sleep(1.5)
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", tickets.vnc))
    assert code == 4401 and "expired" in reason


async def test_ticket_for_another_desktop(desktop, member):
    other = await sync_to_async(DesktopFactory)(workspace=desktop.workspace, private_ip="127.0.0.1")
    code, reason = await closed_with(await relay_for(member, desktop, to=other))
    assert code == 4401 and "not valid" in reason


async def test_user_who_lost_access(desktop, member):
    tickets = await sync_to_async(mint)(member, desktop)
    await sync_to_async(member.delete)()
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", tickets.vnc))
    assert code == 4403 and "no longer" in reason


async def test_desktop_not_running(desktop, member):
    tickets = await sync_to_async(mint)(member, desktop)
    await sync_to_async(type(desktop).objects.filter(id=desktop.id).update)(state=DesktopState.STOPPED)
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", tickets.vnc))
    assert code == 4409 and "stopped" in reason


async def test_desktop_screen_not_answering(desktop, member, relay_settings):
    relay_settings.DESKTOP_VNC_PORT = real.free_port()
    code, reason = await closed_with(await relay_for(member, desktop))
    assert code == 4502 and "screen" in reason


def test_viewers_and_roles_below_the_workspaces_control_role_cannot_mint_control(desktop, member):
    from desktops.errors import Forbidden

    viewer = MembershipFactory(workspace=desktop.workspace, role=Role.VIEWER)
    with pytest.raises(Forbidden):
        mint(viewer, desktop, "control")
    assert mint(viewer, desktop, "view")
    assert mint(member, desktop, "control")
    type(desktop.workspace).objects.filter(id=desktop.workspace_id).update(control_role=Role.ADMIN)
    with pytest.raises(Forbidden, match="needs the Admin role"):
        mint(member, desktop, "control")


async def test_a_person_keeps_a_bounded_number_of_relays_open(desktop, member, relay_settings):
    relay_settings.RELAY_MAX_PER_USER = 3
    held = [await relay_for(member, desktop, mode="view") for _ in range(3)]
    for communicator in held:
        assert (await communicator.receive_from(timeout=5)).startswith(b"RFB ")
    code, reason = await closed_with(await relay_for(member, desktop, mode="view"))
    assert code == 4429 and "3 relays open" in reason
    await held[0].disconnect()
    await asyncio.sleep(0.2)
    again = await relay_for(member, desktop, mode="view")
    assert (await again.receive_from(timeout=5)).startswith(b"RFB ")
    for communicator in [*held[1:], again]:
        await communicator.disconnect()
    assert not await sync_to_async(
        RelayTicket.objects.filter(opened_at__isnull=False, closed_at=None).exists
    )()


# The screen


async def browser_handshake(communicator, version: bytes = b"RFB 003.008\n") -> bytes:
    """What noVNC does, in the RFB version given; returns the ServerInit the relay replays."""
    assert await communicator.receive_from(timeout=5) == b"RFB 003.008\n"
    await communicator.send_to(bytes_data=version)
    security = await communicator.receive_from(timeout=5)
    if version == b"RFB 003.003\n":
        assert security == b"\x00\x00\x00\x01"  # the server picked None
    else:
        assert security == b"\x01\x01"  # only None is offered: the desktop's password stays here
        await communicator.send_to(bytes_data=b"\x01")
        if version == b"RFB 003.008\n":
            assert await communicator.receive_from(timeout=5) == b"\x00\x00\x00\x00"
    await communicator.send_to(bytes_data=b"\x01")  # ClientInit, shared
    return await communicator.receive_from(timeout=5)


def clipboard(display: str) -> str:
    """What an X program reads of the clipboard: nothing when no one owns it, or its owner does not
    answer within 5 s."""
    try:
        result = subprocess.run(
            ["xclip", "-o", "-selection", "clipboard"],
            env={**os.environ, "DISPLAY": display},
            capture_output=True,
            text=True,
            timeout=5,
        )
    except subprocess.TimeoutExpired:
        return ""
    return result.stdout


def cut_text(text: bytes) -> bytes:
    return b"\x06\x00\x00\x00" + len(text).to_bytes(4, "big") + text


@pytest.mark.parametrize("version", [b"RFB 003.003\n", b"RFB 003.007\n", b"RFB 003.008\n"])
@pytest.mark.parametrize(("mode", "reaches_desktop"), [("control", True), ("view", False)])
async def test_screen_input_only_with_a_control_ticket_whatever_the_rfb_version(
    desktop, member, vnc_server, version, mode, reaches_desktop
):
    communicator = await relay_for(member, desktop, mode=mode)
    server_init = await browser_handshake(communicator, version)
    width, height = int.from_bytes(server_init[0:2], "big"), int.from_bytes(server_init[2:4], "big")
    assert (width, height) == (640, 400)
    text = f"typed-through-{mode}-{version[-3:-1].decode()}-{time.monotonic_ns()}".encode()
    await communicator.send_to(bytes_data=cut_text(text))
    await asyncio.sleep(0.5)
    assert (text.decode() in await asyncio.to_thread(clipboard, vnc_server[0])) is reaches_desktop
    # A framebuffer update request is answered in both modes.
    await communicator.send_to(bytes_data=b"\x03\x00\x00\x00\x00\x00\x00\x10\x00\x10")
    assert (await communicator.receive_from(timeout=5))[0] == 0  # FramebufferUpdate
    await communicator.disconnect()


async def test_a_viewer_cannot_desynchronise_the_relay_to_slip_input_through(desktop, member, vnc_server):
    """The old filter followed the handshake from the viewer's bytes: announcing RFB 3.3 made it
    swallow a byte, and what followed was read out of step, so input hidden inside other messages
    reached the desktop. The relay now answers the handshake itself and parses every message."""
    communicator = await relay_for(member, desktop, mode="view")
    await communicator.receive_from(timeout=5)
    text = f"smuggled-{time.monotonic_ns()}".encode()
    # RFB 3.3 expects no security selection from the client: a byte that would be taken for one,
    # then ClientInit, then a clipboard message.
    payload = b"RFB 003.003\n" + b"\x01" + cut_text(text) + b"\x04\x01\x00\x00\x00\x00\x00\x41"
    await communicator.send_to(bytes_data=payload)
    await asyncio.sleep(0.5)
    assert text.decode() not in await asyncio.to_thread(clipboard, vnc_server[0])


def test_the_desktops_own_server_refuses_a_viewers_input_too(vnc_server):
    """Even if a relay let input through, the view-only password makes the server drop it."""
    text = f"through-the-view-password-{time.monotonic_ns()}".encode()
    with socket.create_connection(("127.0.0.1", vnc_server[1]), timeout=5) as conn:
        conn.recv(12)
        conn.sendall(b"RFB 003.008\n")
        conn.recv(64)
        conn.sendall(b"\x02")
        conn.sendall(vnc_auth_response(vnc_password(SCREEN_DESKTOP, "view"), conn.recv(16)))
        assert conn.recv(4) == b"\x00\x00\x00\x00"
        conn.sendall(b"\x01")
        conn.recv(4096)
        conn.sendall(cut_text(text))
        time.sleep(0.5)
    assert text.decode() not in clipboard(vnc_server[0])


# The extended clipboard (UTF-8 text, zlib-compressed), which noVNC and TigerVNC speak to each other.
EXTENDED_CLIPBOARD = -1063131698  # pseudo-encoding 0xC0A1E5CE
TEXT, CAPS, REQUEST, PEEK, NOTIFY, PROVIDE = 1, 1 << 24, 1 << 25, 1 << 26, 1 << 27, 1 << 28
ACCENTS = "Déjà vu : é à ç €"


def extended_cut_text(flags: int, payload: bytes = b"") -> bytes:
    return struct.pack(">BxxxiI", 6, -(4 + len(payload)), flags) + payload


def provide(text: str) -> bytes:
    data = text.encode() + b"\0"
    return extended_cut_text(PROVIDE | TEXT, zlib.compress(struct.pack(">I", len(data)) + data))


async def extended_clipboard_offered(communicator, text: str) -> None:
    """What noVNC sends when the person pastes `text`: the encodings, its capabilities, then a notify
    (the text itself follows when the server asks for it)."""
    await communicator.send_to(bytes_data=struct.pack(">BxHii", 2, 2, 0, EXTENDED_CLIPBOARD))
    await communicator.send_to(
        bytes_data=extended_cut_text(
            CAPS | REQUEST | PEEK | NOTIFY | PROVIDE | TEXT, struct.pack(">I", 1 << 20)
        )
    )
    await communicator.send_to(bytes_data=extended_cut_text(NOTIFY | TEXT))


async def server_cut_texts(communicator, timeout: float):
    """The ServerCutText messages the relay passes on, as (length, payload), until `timeout` passes quietly
    (nothing else comes: no framebuffer update is asked for)."""
    buffer = b""
    # receive_nothing, unlike a receive that times out, leaves the relay running.
    while not await communicator.receive_nothing(timeout=timeout, interval=0.05):
        buffer += await communicator.receive_from()
        while len(buffer) >= 8 and len(buffer) >= 8 + abs(struct.unpack_from(">i", buffer, 4)[0]):
            assert buffer[0] == 3, f"not a ServerCutText: {buffer[:8]!r}"
            length = struct.unpack_from(">i", buffer, 4)[0]
            yield length, buffer[8 : 8 + abs(length)]
            buffer = buffer[8 + abs(length) :]


async def test_unicode_text_pasted_in_control_reaches_the_desktops_clipboard(desktop, member, vnc_server):
    communicator = await relay_for(member, desktop, mode="control")
    await browser_handshake(communicator)
    text = f"{ACCENTS} {time.monotonic_ns()}"
    await extended_clipboard_offered(communicator, text)
    # An X program reading the clipboard makes the server ask the browser for the text. The server
    # owns the clipboard once the relay has passed the notify on: a read before that finds no owner,
    # and reads again.
    for _attempt in range(20):
        reading = asyncio.create_task(asyncio.to_thread(clipboard, vnc_server[0]))
        async for length, payload in server_cut_texts(communicator, timeout=1):
            if length < 0 and struct.unpack_from(">I", payload)[0] & REQUEST:
                await communicator.send_to(bytes_data=provide(text))
                break
        if read := await reading:
            break
    assert read == text
    await communicator.disconnect()


async def test_a_viewer_cannot_put_text_in_the_desktops_clipboard_with_the_extended_clipboard(
    desktop, member, vnc_server
):
    communicator = await relay_for(member, desktop, mode="view")
    await browser_handshake(communicator)
    text = f"{ACCENTS} from a viewer {time.monotonic_ns()}"
    await extended_clipboard_offered(communicator, text)
    await communicator.send_to(bytes_data=provide(text))  # unasked, as an attacker would
    await asyncio.sleep(0.5)
    assert text not in await asyncio.to_thread(clipboard, vnc_server[0])
    await communicator.disconnect()


@pytest.mark.parametrize(("mode", "told"), [("control", True), ("view", False)])
async def test_what_is_copied_in_the_desktop_reaches_only_those_in_control(
    desktop, member, vnc_server, mode, told
):
    """The relay passes the server's bytes as they come: it is the desktop's server that keeps its
    clipboard from a session opened with the view-only password."""
    communicator = await relay_for(member, desktop, mode=mode)
    await browser_handshake(communicator)
    text = f"copied-in-the-desktop-{mode}-{time.monotonic_ns()}"
    subprocess.run(  # xclip stays in the background, owning the clipboard
        ["xclip", "-selection", "clipboard", "-i"],
        input=text.encode(),
        env={**os.environ, "DISPLAY": vnc_server[0]},
        check=True,
        timeout=5,
    )
    received = [payload async for _length, payload in server_cut_texts(communicator, timeout=2)]
    assert any(text.encode() in payload for payload in received) is told
    await communicator.disconnect()


async def test_abandoned_relays_never_lock_others_out_of_a_screen(desktop, member):
    """Five relays abandoned mid-handshake used to get the relays' one address blacklisted by Xvnc."""
    for _ in range(6):
        communicator = await relay_for(member, desktop, mode="view")
        await communicator.disconnect()
    communicator = await relay_for(member, desktop, mode="view")
    assert len(await browser_handshake(communicator)) > 24
    await communicator.disconnect()


async def test_garbage_after_the_handshake_closes_the_relay(desktop, member):
    communicator = await relay_for(member, desktop)
    await browser_handshake(communicator)
    await communicator.send_to(bytes_data=b"\x63nonsense")
    code, reason = await closed_with(communicator)
    assert code == 4400 and "type 99" in reason


async def test_an_rfb_version_the_relay_does_not_speak_closes_it(desktop, member):
    communicator = await relay_for(member, desktop)
    await communicator.receive_from(timeout=5)
    await communicator.send_to(bytes_data=b"RFB 004.000\n")
    assert (await closed_with(communicator))[0] == 4400


# Forced disconnects


async def test_destroying_the_desktop_closes_its_relays(desktop, member, celery_worker):
    communicator = await relay_for(member, desktop)
    await browser_handshake(communicator)
    await sync_to_async(services.desktop_act)(
        actor=Actor(user=member.user), desktop=desktop, action="destroy"
    )
    code, reason = await closed_with(communicator)
    assert code == 4409 and "destroying" in reason
    # The worker's destroy still writes: not while the next test's database is being emptied.
    await sync_to_async(wait_for_idle_lifecycle_worker)()


async def test_removing_the_member_closes_their_relays(desktop, member):
    owner = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.OWNER)
    communicator = await relay_for(member, desktop)
    await browser_handshake(communicator)
    await sync_to_async(services.membership_remove)(
        actor=Actor(user=owner.user), workspace_id=desktop.workspace_id, membership_id=member.id
    )
    code, reason = await closed_with(communicator)
    assert code == 4403 and "no longer" in reason


async def test_demoted_member_loses_control_but_keeps_view(desktop, member):
    owner = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.OWNER)
    control = await relay_for(member, desktop)
    view = await relay_for(member, desktop, mode="view")
    await browser_handshake(control)
    await browser_handshake(view)
    await sync_to_async(services.membership_set_role)(
        actor=Actor(user=owner.user),
        workspace_id=desktop.workspace_id,
        membership_id=member.id,
        role="viewer",
    )
    assert (await closed_with(control))[0] == 4403
    assert await view.receive_nothing(timeout=1)
    await view.disconnect()


async def test_revoking_the_api_key_closes_the_relays_it_opened(desktop, member, ssh_server, tmp_path):
    """A relay opened with an API key's ticket used to keep typing after the key was revoked."""
    from tests.factories import api_key_for

    admin = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.ADMIN)
    token = await sync_to_async(api_key_for)(member)
    key = await sync_to_async(ApiKey.objects.get)(created_by=member.user)
    tickets = await sync_to_async(mint)(member, desktop, api_key=key, session="")
    # A key's ticket is bound to the key, not to a browser session.
    terminal = await open_relay(desktop.id, "terminal", tickets.terminal, session="any")
    await type_in(terminal, "echo still-$((6*7))\n")
    await read_until(terminal, b"still-42")
    await sync_to_async(services.api_key_revoke)(
        actor=Actor(user=admin.user), workspace_id=desktop.workspace_id, key_id=key.id
    )
    code, reason = await closed_with(terminal)
    assert code == 4403 and "API key" in reason
    marker = tmp_path / "after-revoke"
    await type_in(terminal, f"touch {marker}\n")
    await asyncio.sleep(0.5)
    assert not marker.exists() and token


async def test_deactivating_the_user_closes_their_relays(desktop, member):
    communicator = await relay_for(member, desktop)
    await browser_handshake(communicator)
    user = member.user
    user.is_active = False
    await sync_to_async(user.save)()
    code, _ = await closed_with(communicator)
    assert code == 4403


async def test_deleting_the_user_closes_their_relays(desktop, member):
    """Deleting an account (the admin's usual offboarding) used to leave its relays open."""
    communicator = await relay_for(member, desktop)
    await browser_handshake(communicator)
    await sync_to_async(member.user.delete)()
    assert (await closed_with(communicator))[0] == 4403


async def test_deleting_an_api_key_in_the_admin_closes_the_relays_it_opened(desktop, member):
    from tests.factories import api_key_for

    await sync_to_async(api_key_for)(member)
    key = await sync_to_async(ApiKey.objects.get)(created_by=member.user)
    tickets = await sync_to_async(mint)(member, desktop, api_key=key, session="")
    communicator = await open_relay(desktop.id, "vnc", tickets.vnc, session="any")
    await browser_handshake(communicator)
    await sync_to_async(key.delete)()
    code, reason = await closed_with(communicator)
    assert code == 4403 and "API key" in reason


async def test_a_new_password_ends_the_relays_its_sessions_opened_but_not_a_keys(desktop, member):
    """The old password may be what leaked: a relay opened from a browser used to outlive a reset."""
    from tests.factories import api_key_for

    await sync_to_async(api_key_for)(member)
    key = await sync_to_async(ApiKey.objects.get)(created_by=member.user)
    from_browser = await relay_for(member, desktop)
    with_key = await open_relay(
        desktop.id, "vnc", (await sync_to_async(mint)(member, desktop, api_key=key, session="")).vnc
    )
    for communicator in (from_browser, with_key):
        await browser_handshake(communicator)
    user = member.user
    user.set_password("a-new-password-nobody-has-seen")
    await sync_to_async(user.save)()
    code, reason = await closed_with(from_browser)
    assert code == 4403 and "open the desktop again" in reason
    assert await with_key.receive_nothing(timeout=1)
    await with_key.disconnect()


async def test_an_access_change_that_announces_nothing_ends_the_relay_at_its_next_heartbeat(
    desktop, member, monkeypatch
):
    """A queryset update sends no signal: the relay's own heartbeat finds the lost access."""
    monkeypatch.setattr("proxies.consumers.HEARTBEAT_SECONDS", 0.5)
    communicator = await relay_for(member, desktop)
    await browser_handshake(communicator)
    await sync_to_async(Membership.objects.filter(pk=member.pk).update)(role=Role.VIEWER)
    code, reason = await closed_with(communicator)
    assert code == 4403 and "no longer" in reason


# The terminal


async def read_until(communicator, needle: bytes, timeout=10) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        seen += await communicator.receive_from(timeout=max(0.1, deadline - time.monotonic()))
    return seen


@pytest.mark.parametrize(("mode", "runs"), [("control", True), ("view", False)])
async def test_terminal_keystrokes_need_a_control_ticket(desktop, member, ssh_server, tmp_path, mode, runs):
    marker = tmp_path / f"typed-{mode}"
    communicator = await relay_for(member, desktop, "terminal", mode)
    await communicator.send_to(text_data=json.dumps({"type": "resize", "cols": 100, "rows": 30}))
    await type_in(communicator, f"touch {marker}; echo done-$((6*7))\n")
    if runs:
        await read_until(communicator, b"done-42")
    else:
        await asyncio.sleep(1)
    assert marker.exists() is runs
    await communicator.disconnect()


async def test_every_terminal_of_a_desktop_is_one_session_that_outlives_them(desktop, member, ssh_server):
    first = await relay_for(member, desktop, "terminal")
    await type_in(first, "cd /tmp && echo kept-$((6*7))\n")
    await read_until(first, b"kept-42")
    await first.disconnect()
    # A reload finds the same shell: its screen redrawn, its working directory kept.
    again = await relay_for(member, desktop, "terminal")
    await read_until(again, b"kept-42")
    # Someone watching sees what the person in control types, as it runs.
    watcher = await relay_for(member, desktop, "terminal", "view")
    await read_until(watcher, b"kept-42")
    await type_in(again, "echo $(pwd)-shared-$((2*21))\n")
    await read_until(watcher, b"/tmp-shared-42")
    await again.disconnect()
    await watcher.disconnect()


async def test_terminal_stops_reading_until_the_page_catches_up(desktop, member, ssh_server):
    from proxies.consumers import TerminalRelayConsumer as Relay

    communicator = await relay_for(member, desktop, "terminal")
    await type_in(communicator, "yes flood | head -c 20000000\n")
    received = 0
    while not await communicator.receive_nothing(timeout=1):
        received += len(await communicator.receive_from())
    # Without acknowledgements the relay stops just past its high-water mark.
    assert Relay.HIGH_WATER < received <= Relay.HIGH_WATER + 64 * 1024
    await communicator.send_to(text_data=json.dumps({"type": "ack", "bytes": received}))
    more = len(await communicator.receive_from(timeout=5))
    assert more > 0
    await type_in(communicator, "\x03")  # the flood ends here, not in the next test's shared shell
    await communicator.disconnect()


@pytest.fixture
def stalled_sshd():
    """A desktop whose sshd accepts connections and then never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


async def test_stalled_and_idle_terminals_never_hold_up_another_persons(
    desktop, member, ssh_server, stalled_sshd, relay_settings
):
    """Each terminal used to park a thread of a small shared pool in a blocking read: a handful of
    idle terminals, or one desktop whose sshd stalls, froze everybody's."""
    idle = [await relay_for(member, desktop, "terminal") for _ in range(7)]
    for communicator in idle:
        await read_until(communicator, b"#")  # the prompt: each one now waits for output
    relay_settings.DESKTOP_SSH_PORT = stalled_sshd
    stalled_owner = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.MEMBER)
    stalled = [await relay_for(stalled_owner, desktop, "terminal") for _ in range(3)]
    relay_settings.DESKTOP_SSH_PORT = ssh_server
    someone = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.MEMBER)
    started = time.monotonic()
    communicator = await relay_for(someone, desktop, "terminal")
    await type_in(communicator, "echo mine-$((6*7))\n")
    await read_until(communicator, b"mine-42", timeout=5)
    assert time.monotonic() - started < 3
    for each in [*idle, *stalled, communicator]:
        await each.disconnect()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", 4400),
        ("[" * 50_000 + "]" * 50_000, 4413),
        ("[" * 20_000 + "]" * 20_000, 4400),
        (json.dumps({"type": "resize", "cols": 10**9, "rows": 24}), 4400),
        (json.dumps({"type": "resize", "cols": -1, "rows": 24}), 4400),
        (json.dumps({"type": "input", "data": "x" * 100_000}), 4413),
        (json.dumps(["input"]), 4400),
    ],
    ids=["not-json", "oversized", "nested", "huge-resize", "negative-resize", "big-input", "not-an-object"],
)
async def test_malformed_and_oversized_terminal_messages_close_it(desktop, member, ssh_server, frame, code):
    communicator = await relay_for(member, desktop, "terminal")
    await communicator.send_to(text_data=frame)
    assert (await closed_with(communicator))[0] == code


async def test_a_terminal_of_an_absurd_size_is_refused(desktop, member, ssh_server):
    communicator = await relay_for(member, desktop, "terminal", query="?cols=99999&rows=x")
    assert (await closed_with(communicator))[0] == 4400


# The API that mints tickets


def test_sessions_endpoint_mints_tickets_bound_to_the_browser_session(desktop, member):
    from tests.conftest import client_for

    client = client_for(member)
    response = client.post(f"/api/desktops/{desktop.id}/sessions", {"mode": "view"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["mode"] == "view" and body["vncUrl"] == f"/ws/desktops/{desktop.id}/vnc"
    assert body["vncTicket"] != body["terminalTicket"] and "?" not in body["vncUrl"] + body["terminalUrl"]
    stored = RelayTicket.objects.get(ticket_hash__isnull=False, kind="vnc")
    assert stored.session_hash and body["vncTicket"] not in str(vars(stored))
    assert stored.expires_at > timezone.now()
    outsider = MembershipFactory(role=Role.OWNER)
    assert client_for(outsider).post(f"/api/desktops/{desktop.id}/sessions").status_code == 404
