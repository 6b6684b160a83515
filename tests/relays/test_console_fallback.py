"""The fallback to the engine's console of the VNC relay and of the screen API, against the PVE
simulator's vncwebsocket."""

import io

import pytest
from asgiref.sync import sync_to_async
from PIL import Image

from desktops.engines import engine
from desktops.models import DesktopState, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory, MembershipFactory, api_key_for
from tests.pve.support import CONTROL_CIDR, TEMPLATE, driver_for, make_spec, needs_schema
from tests.support import services as real
from tests.support.relays import closed_with, mint, open_relay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_stray_connections")]


@pytest.fixture
def proxmox(settings, sim, monkeypatch):
    """The control plane's Proxmox engine pointed at the simulator; the guest's VNC port is closed."""
    user, token_name, secret = sim.token
    environment = {
        "PROXMOX_HOST": sim.host,
        "PROXMOX_TOKEN_USER": user,
        "PROXMOX_TOKEN_NAME": token_name,
        "PROXMOX_TOKEN_SECRET": secret,
        "PROXMOX_VERIFY_SSL": str(sim.ca_path),
        "PROXMOX_TEMPLATES": f"minimal={TEMPLATE}",
        "PROXMOX_CONTROL_CIDRS": CONTROL_CIDR,
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings.DESKTOP_VNC_PORT = real.free_port()
    engine.cache_clear()
    yield
    engine.cache_clear()


@pytest.fixture
def desktop(proxmox, sim, plan):
    desktop = DesktopFactory(state=DesktopState.RUNNING, driver="proxmox", private_ip="127.0.0.1")
    # The VM as a worker would have made it (the simulator has no guest to set up over SSH).
    driver_for(sim).provision(make_spec(key=desktop.id, hostname=desktop.id))
    return desktop


async def open_vnc(desktop):
    member = await sync_to_async(MembershipFactory)(workspace=desktop.workspace, role=Role.MEMBER)
    tickets = await sync_to_async(mint)(member, desktop)
    return await open_relay(desktop.id, "vnc", tickets.vnc)


@needs_schema
async def test_a_vm_whose_vnc_server_is_down_still_shows_its_console(desktop, sim):
    communicator = await open_vnc(desktop)
    # The browser meets a server without authentication, as with the guest's own.
    assert await communicator.receive_from(timeout=10) == b"RFB 003.008\n"
    await communicator.send_to(bytes_data=b"RFB 003.008\n")
    assert await communicator.receive_from(timeout=5) == b"\x01\x01"
    await communicator.send_to(bytes_data=b"\x01")
    assert await communicator.receive_from(timeout=5) == b"\x00\x00\x00\x00"
    await communicator.send_to(bytes_data=b"\x01")  # ClientInit, shared
    server_init = await communicator.receive_from(timeout=5)
    width, height = int.from_bytes(server_init[0:2], "big"), int.from_bytes(server_init[2:4], "big")
    assert (width, height) == (800, 600)
    vmid = sim.vm_by_name(desktop.id.replace("_", "-")).vmid
    assert server_init.endswith(f"VM {vmid}".encode())
    # A framebuffer update request is answered through the console.
    await communicator.send_to(bytes_data=b"\x03\x00\x00\x00\x00\x00\x00\x10\x00\x10")
    update = await communicator.receive_from(timeout=5)
    assert update[0] == 0 and len(update) == 4 + 12 + 16 * 16 * 4
    # The relay asked PVE for a generated password, never sending the ticket's predictable one.
    proxy = next(p for m, path, p in sim.requests if path.endswith("/vncproxy"))
    assert (proxy["websocket"], proxy["generate-password"]) == ("1", "1")
    await communicator.disconnect()


@needs_schema
@pytest.mark.parametrize("expired", ["vnc_ticket_lifetime", "vnc_password_lifetime"])
async def test_a_refused_console_closes_the_relay_with_its_own_code(desktop, sim, expired):
    setattr(sim, expired, 0)
    communicator = await open_vnc(desktop)
    code, reason = await closed_with(communicator)
    assert (code, reason) == (4503, "The desktop's console refused the relay.")


async def test_an_engine_without_a_console_says_the_screen_is_not_answering(settings, plan):
    settings.DESKTOP_VNC_PORT = real.free_port()
    desktop = await sync_to_async(DesktopFactory)(state=DesktopState.RUNNING, private_ip="127.0.0.1")
    code, reason = await closed_with(await open_vnc(desktop))
    assert (code, reason) == (4502, "The desktop's screen is not answering.")


@needs_schema
def test_a_vm_whose_vnc_server_is_down_still_has_screenshots_and_takes_input(desktop, sim):
    viewer = client_for(key=api_key_for(MembershipFactory(workspace=desktop.workspace, role=Role.VIEWER)))
    response = viewer.get(f"/api/desktops/{desktop.id}/screenshot?width=400")
    assert response.status_code == 200, response.content
    image = Image.open(io.BytesIO(response.content))
    # The simulator's console: a blank 800x600 screen, scaled to half.
    assert image.size == (400, 300) and image.getcolors() == [(400 * 300, (0, 0, 0))]
    assert (response["X-Screen-Width"], response["X-Screenshot-Scale"]) == ("800", "0.500000")
    assert viewer.get(f"/api/desktops/{desktop.id}/screen").json()["width"] == 800

    member = client_for(key=api_key_for(MembershipFactory(workspace=desktop.workspace, role=Role.MEMBER)))
    body = {
        "actions": [{"type": "click", "x": 799, "y": 599}, {"type": "type", "text": "é"}],
        "screenshot": True,
    }
    done = member.post(f"/api/desktops/{desktop.id}/actions", body, format="json").json()
    assert done["count"] == 2 and done["screenshot"]["screenWidth"] == 800
    beyond = {"actions": [{"type": "click", "x": 800, "y": 10}]}
    assert member.post(f"/api/desktops/{desktop.id}/actions", beyond, format="json").status_code == 400
    # Every way in was a console of its own, opened with PVE's one-time password.
    assert sum(path.endswith("/vncproxy") for _method, path, _params in sim.requests) == 4
