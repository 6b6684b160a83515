"""An admin closes a running desktop's internet from its Network tab in real Chromium; packets follow."""

import pytest
from playwright.sync_api import expect

from desktops.models import Role
from tests.conftest import LXC_IMAGE
from tests.e2e.conftest import let_the_network_settle, log_in, screenshot
from tests.support.desktops import provision
from tests.support.internet import BLOCKED
from tests.test_lxc_egress import fetch, within

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no minimal golden image (make setup builds it)"),
]


def test_an_admin_denies_a_desktop_the_internet_from_its_page(page, site, lxc_api, members, internet):
    desktop = provision(lxc_api, "e2e-egress")
    assert fetch(desktop, f"http://{BLOCKED}/") == f"stand-in {BLOCKED}"
    let_the_network_settle(page)

    log_in(page, site, members[Role.ADMIN].user.email)
    page.goto(f"{site}/desktops/{desktop.id}/#egress-panel")
    panel = page.locator("#egress-panel")
    expect(panel).to_be_visible()
    expect(panel.locator("#egress-mode")).to_contain_text("Open")
    panel.locator("input[name=mode][value=deny]").check()
    panel.locator("button[type=submit]").click()
    page.wait_for_url(f"{site}/desktops/{desktop.id}/#egress-panel")
    expect(page.locator("#egress-panel #egress-mode")).to_contain_text("Deny all")
    screenshot(page, "egress-01-denied")

    within(10, lambda: fetch(desktop, f"http://{BLOCKED}/") is None)
    page.reload()
    expect(page.locator("#blocked-egress")).to_contain_text(BLOCKED)
    screenshot(page, "egress-02-blocked-destinations")
