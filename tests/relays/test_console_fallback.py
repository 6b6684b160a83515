"""The VNC relay's fallback to the engine's console, against the PVE simulator's vncwebsocket."""

import pytest
from asgiref.sync import sync_to_async

from desktops.engines import engine
from desktops.models import DesktopState, Role
from tests.factories import DesktopFactory, MembershipFactory
from tests.pve.support import CONTROL_CIDR, TEMPLATE, driver_for, make_spec, needs_schema, simulator
from tests.support import services as real
from tests.support.relays import closed_with, mint, open_relay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_stray_connections")]


@pytest.fixture
def sim():
    sim = simulator()
    yield sim
    sim.stop()


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
