"""The operator's path through Mission Control, in real Chromium, on a real LXC desktop.

Sign up -> own workspace -> New Computer -> the row goes live from provisioning to running
without a reload -> open the viewer -> stop it -> the badge turns stopped.
"""

import pytest
from playwright.sync_api import expect

from desktops.models import Desktop
from tests.conftest import LXC_IMAGE, web_server
from tests.e2e.conftest import let_the_network_settle, screenshot

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no minimal golden image (make setup builds it)"),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory, driver_dir):
    with web_server(driver_dir, tmp_path_factory.getbasetemp(), COMPUTE_DRIVER="lxc") as url:
        yield url


def test_sign_up_to_a_running_desktop_and_back(page, site, lxc_api):
    page.goto(f"{site}/accounts/signup/")
    screenshot(page, "mc-01-sign-up")
    page.fill("input[name=email]", "operator@example.com")
    page.fill("input[name=password1]", "a long enough passphrase 42")
    page.fill("input[name=password2]", "a long enough passphrase 42")
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Desktops")
    expect(page.locator("header.top")).to_contain_text("operator's workspace")
    expect(page.locator("#live")).to_have_text("live", timeout=10000)
    screenshot(page, "mc-02-empty-workspace")

    page.fill("input[name=name]", "first-agent")
    page.select_option("select[name=image_profile]", "minimal")
    page.click("#new-computer button[type=submit]")
    row = page.locator("tr", has_text="first-agent")
    expect(row).to_be_visible()
    screenshot(page, "mc-03-provisioning")
    # No reload from here on: the row follows the server-sent events.
    page.evaluate("window.__sameDocument = true")
    expect(row.locator("[data-field=state]")).to_have_text("running", timeout=60000)
    expect(row.locator("[data-field=private_ip]")).to_contain_text("10.215.0.")
    # The banner of the creation says what became of it, no longer that it is under way.
    expect(page.locator(".messages")).to_have_text("first-agent is running.")
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "mc-04-running")

    let_the_network_settle(page)
    row.get_by_role("link", name="first-agent").click()
    expect(page.locator("#screen canvas")).to_be_visible(timeout=15000)
    expect(page.locator("#screen-status")).to_be_hidden(timeout=15000)
    screenshot(page, "mc-05-viewer")
    page.click("text=Timeline")
    expect(page.locator("#timeline-panel")).to_contain_text("running")
    page.click("text=Details")
    expect(page.locator("#details-panel")).to_contain_text("minimal")

    page.click("header.top >> text=Desktops")
    row = page.locator("tr", has_text="first-agent")
    row.locator("input[type=checkbox]").check()
    page.click("button[value=stop]")
    expect(page.locator(".messages")).to_contain_text("first-agent: “Stop” asked.")
    page.evaluate("window.__sameDocument = true")
    expect(row.locator("[data-field=state]")).to_have_text("stopped", timeout=30000)
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "mc-06-stopped")
    assert Desktop.objects.get(name="first-agent").state == "stopped"

    page.click("header.top >> text=Settings")
    screenshot(page, "mc-07-settings")
    page.click("header.top >> text=Audit")
    # Each act in words, its code on hover, its target by name.
    stopped = page.locator("table span[title='desktop.stopped']")
    expect(stopped).to_have_text("now stopped")
    expect(stopped.locator("xpath=../..")).to_contain_text("first-agent")
    screenshot(page, "mc-08-audit")
    page.set_viewport_size({"width": 390, "height": 800})
    page.click("header.top >> text=Desktops")
    screenshot(page, "mc-09-phone-width")
