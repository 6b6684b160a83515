"""The desktops list as a fleet view, in real Chromium: each running desktop's screen as a thumbnail,
and an agent's failed turn reaching its row and the summary live, without a reload.

The desktop is a real LXC desktop of the minimal image, which has no agent runtime: a message to it
fails, as a turn fails for real.
"""

import pytest
from playwright.sync_api import expect

from desktops.models import Role
from tests.conftest import LXC_IMAGE
from tests.e2e.conftest import log_in, screenshot
from tests.factories import MembershipFactory
from tests.support.desktops import provision

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no minimal golden image (make setup builds it)"),
]


def test_a_failed_turn_reaches_the_list_and_its_summary_live(page, site, lxc_api, workspace):
    desktop = provision(lxc_api, "fleet-agent")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    log_in(page, site, member.user.email)
    summary = page.locator("#fleet-summary")
    expect(summary.locator("[data-figure=running]")).to_have_text("1")
    expect(summary.locator("[data-figure=in_error]")).to_have_text("0")
    expect(page.locator("#live")).to_have_text("live", timeout=10000)
    # The running desktop's screen, as a thumbnail taken through the screenshot API.
    thumbnail = page.locator(f"tr[data-desktop='{desktop.id}'] img.thumb")
    expect(thumbnail).to_be_visible()
    page.wait_for_function("img => img.complete && img.naturalWidth === 160", arg=thumbnail.element_handle())
    page.evaluate("window.__sameDocument = true")

    response = lxc_api.post(f"/api/desktops/{desktop.id}/chat", {"message": "Range le bureau"}, format="json")
    assert response.status_code == 202, response.content
    row = page.locator(f"tr[data-desktop='{desktop.id}']")
    expect(row.locator("[data-field=outcome]")).to_contain_text("failed", timeout=30000)
    expect(row.locator("[data-field=outcome]")).to_contain_text("no agent runtime")
    expect(summary.locator("[data-figure=in_error]")).to_have_text("1")
    expect(summary.locator("a.alert")).to_be_visible()
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "fleet-01-failed-turn")
