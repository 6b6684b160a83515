"""Open a running desktop's viewer in real Chromium, type into its screen and its terminal.

The desktop here is a real Xvnc (with an xterm on it) and a real sshd on loopback;
the LXC suite runs the same walk against a real LXC desktop.
"""

import time

import pytest
from playwright.sync_api import expect

from desktops.models import DesktopState, Role
from tests.conftest import web_server
from tests.e2e.conftest import log_in, screenshot
from tests.factories import DesktopFactory, MembershipFactory
from tests.support import services as real
from workers.ssh import control_plane_public_key, desktop_ssh_connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def loopback_desktop(tmp_path_factory, driver_dir):
    """Xvnc + sshd on loopback, and daphne configured to reach them as a desktop's services."""
    workdir = tmp_path_factory.mktemp("loopback-desktop")
    basetemp = tmp_path_factory.getbasetemp()
    with (
        real.xvnc(geometry="1024x640") as (display, vnc_port),
        real.sshd(workdir, control_plane_public_key()) as ssh_port,
        web_server(
            driver_dir,
            basetemp,
            DESKTOP_VNC_PORT=str(vnc_port),
            DESKTOP_SSH_PORT=str(ssh_port),
            DESKTOP_SSH_USER="root",
        ) as url,
    ):
        yield {"url": url, "display": display, "vnc_port": vnc_port, "ssh_port": ssh_port}


def test_viewer_screen_and_terminal(page, loopback_desktop, plan, settings, tmp_path):
    settings.DESKTOP_SSH_PORT = loopback_desktop["ssh_port"]
    settings.DESKTOP_SSH_USER = "root"
    base = loopback_desktop["url"]
    desktop = DesktopFactory(state=DesktopState.RUNNING, private_ip="127.0.0.1", name="e2e-desk")
    member = MembershipFactory(workspace=desktop.workspace, role=Role.MEMBER)

    log_in(page, base, member.user.email, PASSWORD)
    screenshot(page, "viewer-01-desktops")
    page.click("text=e2e-desk")
    page.wait_for_url(f"{base}/desktops/{desktop.id}/")
    expect(page.locator("#screen canvas")).to_be_visible(timeout=15000)
    expect(page.locator("#screen-status")).to_be_hidden(timeout=15000)
    screenshot(page, "viewer-02-connected")

    # Click into the desktop's xterm (drawn at +10+10) and type a command into the screen.
    marker = tmp_path / f"typed-on-screen-{int(time.time())}"
    canvas = page.locator("#screen canvas").bounding_box()
    page.mouse.click(canvas["x"] + canvas["width"] * 0.1, canvas["y"] + canvas["height"] * 0.05)
    page.keyboard.type(f"touch {marker}\n", delay=20)
    with desktop_ssh_connect(desktop_id=desktop.id, host="127.0.0.1") as ssh:
        deadline = time.monotonic() + 10
        while ssh.exec_command(f"test -f {marker} && echo yes")[1].read().strip() != b"yes":
            assert time.monotonic() < deadline, "the keystrokes typed on the screen never ran"
            time.sleep(0.2)
    screenshot(page, "viewer-03-typed-on-screen")

    # The web terminal: type echo and read the answer back from the page.
    expect(page.locator("#terminal-status")).to_be_hidden(timeout=15000)
    page.click("#terminal")
    page.keyboard.type("echo relay-$((40+2))\n", delay=10)
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("relay-42", timeout=10000)
    screenshot(page, "viewer-04-terminal")

    # View mode: the relay itself drops input, whatever the page does.
    page.click("#mode-view")
    expect(page.locator("#mode-view")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#screen-status")).to_be_hidden(timeout=15000)
    expect(page.locator("#terminal-status")).to_be_hidden(timeout=15000)
    page.evaluate("document.querySelector('#terminal textarea').removeAttribute('disabled')")
    page.click("#terminal")
    page.keyboard.type("echo viewer-typed-$((1+1))\n", delay=10)
    page.wait_for_timeout(1000)
    expect(page.locator("#terminal .xterm-rows")).not_to_contain_text("viewer-typed-2")
    screenshot(page, "viewer-05-view-mode")
