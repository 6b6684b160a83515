"""The VNC and terminal relays with WebsocketCommunicator, against a real Xvnc and a real sshd."""

import asyncio
import json
import os
import subprocess
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from desktops import services
from desktops.audit import Actor
from desktops.guest import control_plane_public_key
from desktops.models import DesktopState, Role
from lebureau.asgi import application
from proxies.sessions import relay_session_create
from tests.factories import DesktopFactory, MembershipFactory
from tests.support import services as real

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_stray_connections")]


@pytest.fixture(scope="module")
def vnc_server():
    with real.xvnc() as server:
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


@pytest.fixture
def desktop(relay_settings, plan):
    return DesktopFactory(state=DesktopState.RUNNING, private_ip="127.0.0.1")


@pytest.fixture
def member(desktop):
    return MembershipFactory(workspace=desktop.workspace, role=Role.MEMBER)


def token(member, desktop, mode="control"):
    return relay_session_create(actor=Actor(user=member.user), desktop_id=desktop.id, mode=mode).token


async def relay_for(member, desktop, kind="vnc", mode="control", *, to=None):
    """A relay opened with a fresh token of the member's for `desktop` (or to another desktop)."""
    minted = await sync_to_async(token)(member, desktop, mode)
    return await open_relay((to or desktop).id, kind, minted)


async def type_in(communicator, text: str):
    await communicator.send_to(text_data=json.dumps({"type": "input", "data": text}))


async def open_relay(desktop_id: str, kind: str, token: str | None, **query):
    params = "&".join(f"{k}={v}" for k, v in ({"token": token} if token else {}).items() | query.items())
    communicator = WebsocketCommunicator(
        application, f"/ws/desktops/{desktop_id}/{kind}?{params}", headers=[(b"origin", b"http://127.0.0.1")]
    )
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


async def closed_with(communicator, timeout=5):
    while True:
        message = await communicator.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return message["code"], message.get("reason", "")


# Every token case closes the socket before a byte reaches the desktop


@pytest.mark.parametrize("kind", ["vnc", "terminal"])
async def test_no_token(desktop, kind):
    code, reason = await closed_with(await open_relay(desktop.id, kind, None))
    assert code == 4401 and "required" in reason


async def test_bad_token(desktop):
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", "forged.token:value"))
    assert code == 4401 and "not valid" in reason


async def test_expired_token(desktop, member, relay_settings):
    relay_settings.RELAY_TOKEN_MAX_AGE = 1
    stale = await sync_to_async(token)(member, desktop)
    await asyncio.sleep(2.1)
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", stale))
    assert code == 4401 and "expired" in reason


async def test_token_for_another_desktop(desktop, member):
    other = await sync_to_async(DesktopFactory)(workspace=desktop.workspace, private_ip="127.0.0.1")
    code, reason = await closed_with(await relay_for(member, desktop, to=other))
    assert code == 4403 and "another desktop" in reason


async def test_user_who_lost_access(desktop, member):
    minted = await sync_to_async(token)(member, desktop)
    await sync_to_async(member.delete)()
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", minted))
    assert code == 4403 and "no longer" in reason


async def test_desktop_not_running(desktop, member):
    minted = await sync_to_async(token)(member, desktop)
    await sync_to_async(type(desktop).objects.filter(id=desktop.id).update)(state=DesktopState.STOPPED)
    code, reason = await closed_with(await open_relay(desktop.id, "vnc", minted))
    assert code == 4409 and "stopped" in reason


async def test_desktop_screen_not_answering(desktop, member, relay_settings):
    relay_settings.DESKTOP_VNC_PORT = real.free_port()
    code, reason = await closed_with(await relay_for(member, desktop))
    assert code == 4502 and "screen" in reason


def test_viewer_cannot_mint_a_control_token(desktop):
    viewer = MembershipFactory(workspace=desktop.workspace, role=Role.VIEWER)
    from desktops.errors import Forbidden

    with pytest.raises(Forbidden):
        token(viewer, desktop, "control")
    assert token(viewer, desktop, "view")


# VNC


async def rfb_handshake(communicator) -> bytes:
    version = await communicator.receive_from(timeout=5)
    assert version.startswith(b"RFB 003.")
    await communicator.send_to(bytes_data=b"RFB 003.008\n")
    security = await communicator.receive_from(timeout=5)
    assert 1 in security[1:]  # security type None is offered
    await communicator.send_to(bytes_data=b"\x01")
    assert await communicator.receive_from(timeout=5) == b"\x00\x00\x00\x00"  # SecurityResult OK
    await communicator.send_to(bytes_data=b"\x01")  # ClientInit, shared
    return await communicator.receive_from(timeout=5)  # ServerInit


def clipboard(display: str) -> str:
    result = subprocess.run(
        ["xclip", "-o", "-selection", "clipboard"],
        env={**os.environ, "DISPLAY": display},
        capture_output=True,
        text=True,
        timeout=5,
    )
    return result.stdout


@pytest.mark.parametrize(("mode", "reaches_desktop"), [("control", True), ("view", False)])
async def test_vnc_input_only_with_a_control_token(desktop, member, vnc_server, mode, reaches_desktop):
    communicator = await relay_for(member, desktop, mode=mode)
    server_init = await rfb_handshake(communicator)
    width, height = int.from_bytes(server_init[0:2], "big"), int.from_bytes(server_init[2:4], "big")
    assert (width, height) == (640, 400)
    text = f"typed-through-{mode}-{time.monotonic_ns()}".encode()
    await communicator.send_to(bytes_data=b"\x06\x00\x00\x00" + len(text).to_bytes(4, "big") + text)
    await asyncio.sleep(0.5)
    assert (text.decode() in await asyncio.to_thread(clipboard, vnc_server[0])) is reaches_desktop
    # A framebuffer update request is answered in both modes.
    await communicator.send_to(bytes_data=b"\x03\x00\x00\x00\x00\x00\x00\x10\x00\x10")
    assert (await communicator.receive_from(timeout=5))[0] == 0  # FramebufferUpdate
    await communicator.disconnect()


async def test_garbage_after_the_handshake_closes_the_relay(desktop, member):
    communicator = await relay_for(member, desktop)
    await rfb_handshake(communicator)
    await communicator.send_to(bytes_data=b"\x63nonsense")
    code, reason = await closed_with(communicator)
    assert code == 4400 and "type 99" in reason


async def test_destroying_the_desktop_closes_its_relays(desktop, member, celery_worker):
    communicator = await relay_for(member, desktop)
    await rfb_handshake(communicator)
    await sync_to_async(services.desktop_act)(
        actor=Actor(user=member.user), desktop=desktop, action="destroy"
    )
    code, reason = await closed_with(communicator)
    assert code == 4409 and "destroying" in reason


async def test_removing_the_member_closes_their_relays(desktop, member):
    owner = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.OWNER)
    communicator = await relay_for(member, desktop)
    await rfb_handshake(communicator)
    await sync_to_async(services.membership_remove)(
        actor=Actor(user=owner.user), workspace_id=desktop.workspace_id, membership_id=member.id
    )
    code, reason = await closed_with(communicator)
    assert code == 4403 and "no longer" in reason


async def test_demoted_member_loses_control_but_keeps_view(desktop, member):
    owner = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.OWNER)
    control = await relay_for(member, desktop)
    view = await relay_for(member, desktop, mode="view")
    await rfb_handshake(control)
    await rfb_handshake(view)
    await sync_to_async(services.membership_set_role)(
        actor=Actor(user=owner.user),
        workspace_id=desktop.workspace_id,
        membership_id=member.id,
        role="viewer",
    )
    assert (await closed_with(control))[0] == 4403
    assert await view.receive_nothing(timeout=1)
    await view.disconnect()


# Terminal


async def read_until(communicator, needle: bytes, timeout=10) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        seen += await communicator.receive_from(timeout=max(0.1, deadline - time.monotonic()))
    return seen


@pytest.mark.parametrize(("mode", "runs"), [("control", True), ("view", False)])
async def test_terminal_keystrokes_need_a_control_token(desktop, member, ssh_server, tmp_path, mode, runs):
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
    await communicator.disconnect()


async def test_malformed_terminal_message_closes(desktop, member, ssh_server):
    communicator = await relay_for(member, desktop, "terminal")
    await communicator.send_to(text_data="not json")
    code, _ = await closed_with(communicator)
    assert code == 4400


# The API that mints sessions


def test_sessions_endpoint(desktop, member):
    from tests.conftest import client_for

    response = client_for(member).post(
        f"/api/desktops/{desktop.id}/sessions", {"mode": "view"}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    assert body["mode"] == "view" and body["vncUrl"] == f"/ws/desktops/{desktop.id}/vnc?token={body['token']}"
    outsider = MembershipFactory(role=Role.OWNER)
    assert client_for(outsider).post(f"/api/desktops/{desktop.id}/sessions").status_code == 404
