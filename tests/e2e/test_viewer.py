"""Open a running desktop's viewer in real Chromium, type into its screen and its terminal.

The desktop is a real LXC desktop made through the API by the Celery worker; the browser talks
only to the control plane's daphne, which relays to the desktop's VNC server and sshd.
"""

import re
import time

import pytest
from playwright.sync_api import expect

from desktops.models import Desktop, Role
from tests.conftest import LXC_IMAGE, web_server
from tests.e2e.conftest import let_the_network_settle, log_in, screenshot
from tests.factories import MembershipFactory
from tests.support.desktops import provision, run, wait_for_state
from tests.support.services import free_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no minimal golden image (make setup builds it)"),
]


def _appears_within(seconds, check):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return False


def test_viewer_screen_and_terminal(page, site, lxc_api, workspace):
    desktop = provision(lxc_api, "e2e-desk")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    let_the_network_settle(page)

    log_in(page, site, member.user.email)
    screenshot(page, "viewer-01-desktops")
    page.click("text=e2e-desk")
    page.wait_for_url(f"{site}/desktops/{desktop.id}/")
    expect(page.locator("#screen canvas")).to_be_visible(timeout=30000)
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
    screenshot(page, "viewer-02-connected")
    # The viewer opens watching; control is taken explicitly.
    expect(page.locator("#mode-view")).to_have_attribute("aria-pressed", "true")
    page.click("#mode-control")
    expect(page.locator("#mode-control")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)

    # Click into the desktop's xterm (at +40+40 on its 1280x800 screen) and type a command there.
    marker = f"/tmp/typed-on-screen-{int(time.time())}"
    # The session's xterm maps a moment after VNC answers, at a time no page event tells: keys sent
    # before it are lost, so the line is typed again (after Ctrl+U clears any part of it) until it runs.
    canvas = page.locator("#screen canvas").bounding_box()
    for _attempt in range(4):
        page.mouse.click(canvas["x"] + canvas["width"] * 0.2, canvas["y"] + canvas["height"] * 0.2)
        page.keyboard.press("Control+u")
        page.keyboard.type(f"touch {marker}\n", delay=20)
        if _appears_within(5, lambda: run(desktop, f"test -f {marker} && echo y || echo n").strip() == "y"):
            break
    else:
        raise AssertionError("the keystrokes typed on the screen never ran in the desktop")
    screenshot(page, "viewer-03-typed-on-screen")

    # The web terminal: type echo and read the answer back from the page.
    expect(page.locator("#terminal-status")).to_be_hidden(timeout=15000)
    page.click("#terminal")
    page.keyboard.type("echo relay-$((40+2))\n", delay=10)
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("relay-42", timeout=10000)
    expect(page.locator("#terminal-view-only")).to_be_hidden()
    screenshot(page, "viewer-04-terminal")

    # The chat pane: a task for the agent, and its answer (here the workspace's agent is `echo`).
    workspace.agent_command = "echo done: {message}"
    workspace.save(update_fields=["agent_command"])
    page.fill("#chat-text", "compte les fichiers")
    page.click("#chat-form button")
    expect(page.locator("#chat-log")).to_contain_text("done: compte les fichiers", timeout=20000)
    screenshot(page, "viewer-05-chat")

    # View mode: the relay itself drops input, whatever the page does.
    page.click("#mode-view")
    expect(page.locator("#mode-view")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
    expect(page.locator("#terminal-status")).to_be_hidden(timeout=15000)
    page.evaluate("document.querySelector('#terminal textarea').removeAttribute('disabled')")
    page.click("#terminal")
    page.keyboard.type("echo viewer-typed-$((1+1))\n", delay=10)
    page.wait_for_timeout(1000)
    expect(page.locator("#terminal .xterm-rows")).not_to_contain_text("viewer-typed-2")
    expect(page.locator("#terminal-view-only")).to_be_visible()
    # Watching shows the very shell typed into in control: one session per desktop, kept.
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("relay-42")
    screenshot(page, "viewer-06-view-mode")

    # A reload finds it again, running programs, screen and all.
    page.reload()
    expect(page.locator("#terminal-status")).to_be_hidden(timeout=15000)
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("relay-42", timeout=10000)

    # Stopping the desktop (as the page's own API calls do) closes the relays with words.
    page.evaluate(
        """id => fetch(`/api/desktops/${id}/stop`, {method: "POST", headers: {
            "X-CSRFToken": document.querySelector("[name=csrfmiddlewaretoken]").value}})""",
        desktop.id,
    )
    expect(page.locator("#screen-status")).to_contain_text("stopped", timeout=30000)
    screenshot(page, "viewer-07-stopped")


def test_open_viewers_reconnect_by_themselves_after_the_web_server_restarts(
    page, lxc_api, workspace, driver_dir, tmp_path
):
    desktop = provision(lxc_api, "e2e-restart")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    let_the_network_settle(page)
    port = free_port()
    with web_server(driver_dir, tmp_path, port=port) as site:
        log_in(page, site, member.user.email)
        page.goto(f"{site}/desktops/{desktop.id}/")
        expect(page.locator("#screen canvas")).to_be_visible(timeout=30000)
        expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
        expect(page.locator("#terminal-status")).to_be_hidden(timeout=15000)
        page.click("#mode-control")
        expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
    # Both relays went with the server: the page says so and keeps trying.
    expect(page.locator("#screen-status")).to_be_visible(timeout=10000)
    screenshot(page, "viewer-restart-01-down")
    with web_server(driver_dir, tmp_path, port=port):
        expect(page.locator("#screen-status")).to_be_hidden(timeout=45000)
        expect(page.locator("#terminal-status")).to_be_hidden(timeout=45000)
        # Back in the mode the person had chosen: the keys reach the shell.
        expect(page.locator("#mode-control")).to_have_attribute("aria-pressed", "true")
        page.click("#terminal")
        page.keyboard.type("echo back-$((40+2))\n", delay=10)
        expect(page.locator("#terminal .xterm-rows")).to_contain_text("back-42", timeout=10000)
        screenshot(page, "viewer-restart-02-back")


def test_two_people_watch_and_one_takes_control(page, browser, site, lxc_api, workspace):
    desktop = provision(lxc_api, "e2e-watched")
    first = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    second = MembershipFactory(workspace=workspace, role=Role.VIEWER)
    let_the_network_settle(page)
    other_context = browser.new_context(viewport={"width": 1280, "height": 800})
    other = other_context.new_page()
    try:
        for who, person in ((page, first), (other, second)):
            log_in(who, site, person.user.email)
            who.goto(f"{site}/desktops/{desktop.id}/")
            expect(who.locator("#screen-status")).to_be_hidden(timeout=30000)
        # Both opened watching: nobody has control until someone takes it.
        expect(other.locator("#watchers")).to_contain_text("2 people watching", timeout=10000)
        expect(other.locator("#watchers")).not_to_contain_text("has control")
        expect(page.locator("#mode-view")).to_have_attribute("aria-pressed", "true")

        page.click("#mode-control")
        expect(page.locator("#watchers")).to_contain_text("You have control", timeout=10000)
        expect(other.locator("#watchers")).to_contain_text(f"{first.user.email} has control", timeout=10000)
        screenshot(other, "viewer-08-someone-else-has-control")

        page.click("#mode-view")
        expect(other.locator("#watchers")).not_to_contain_text("has control", timeout=10000)
    finally:
        other_context.close()


def test_the_desktops_lifecycle_from_its_viewer(page, site, lxc_api, workspace):
    desktop = provision(lxc_api, "e2e-lifecycle")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    let_the_network_settle(page)
    log_in(page, site, member.user.email)
    page.goto(f"{site}/desktops/{desktop.id}/")
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
    lifecycle, badge = page.locator("#lifecycle"), page.locator("#state")
    blocked = ["#chat-form button", "#mode-control", "#clipboard-form button"]
    expect(lifecycle.locator("[data-action=start]")).to_be_hidden()
    expect(lifecycle.locator("[data-action=resume]")).to_be_hidden()

    lifecycle.locator("[data-action=suspend]").click()
    expect(badge).to_have_text("suspended", timeout=30000)
    # Sending, taking control and pasting wait for the desktop to run again, and say so.
    expect(page.locator("#not-running")).to_be_visible()
    for control in blocked:
        expect(page.locator(control)).to_be_disabled()
        expect(page.locator(control)).to_have_attribute("title", re.compile("suspended: resume it"))
    expect(lifecycle.locator("[data-action=suspend]")).to_be_hidden()
    screenshot(page, "viewer-09-suspended")

    lifecycle.locator("[data-action=resume]").click()
    expect(badge).to_have_text("running", timeout=30000)
    expect(page.locator("#not-running")).to_be_hidden()
    for control in blocked:
        expect(page.locator(control)).to_be_enabled()
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)  # the screen comes back by itself

    lifecycle.locator("[data-action=stop]").click()
    expect(badge).to_have_text("stopped", timeout=30000)
    expect(page.locator("#chat-form button")).to_be_disabled()
    lifecycle.locator("[data-action=start]").click()
    expect(badge).to_have_text("running", timeout=30000)

    # Destroying asks for the desktop's name: a wrong one destroys nothing.
    lifecycle.locator("[data-action=destroy]").click()
    page.fill("#destroy-typed", "e2e-wrong")
    expect(page.locator("#destroy-confirm")).to_be_disabled()
    page.click("#destroy-cancel")
    page.wait_for_timeout(500)
    assert Desktop.objects.get(id=desktop.id).state == "running"
    lifecycle.locator("[data-action=destroy]").click()
    page.fill("#destroy-typed", "e2e-lifecycle")
    page.click("#destroy-confirm")
    page.wait_for_url(f"{site}/w/{workspace.id}/desktops/")
    wait_for_state(desktop.id, "destroyed", timeout=60)
