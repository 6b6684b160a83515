"""The desktops list while it changes under one's eyes, in real Chromium: rows follow the workspace's
events (sent here by the lifecycle's own functions, as the worker calls them) without their columns
moving, and the count of what the filter matches follows too."""

import pytest
from playwright.sync_api import expect

from desktops.audit import SYSTEM
from desktops.lifecycle import desktop_progress, transition
from desktops.models import DesktopState, Role
from tests.e2e.conftest import log_in, screenshot
from tests.factories import DesktopFactory, MembershipFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def column_edges(page) -> list[float]:
    return page.evaluate(
        "[...document.querySelectorAll('#desktops-table thead th')]"
        ".filter(th => th.offsetParent).map(th => Math.round(th.getBoundingClientRect().left))"
    )


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_columns_stay_put_as_rows_change_live(browser, site, workspace, plan, width, height):
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name="a")
    coming = DesktopFactory(workspace=workspace, state=DesktopState.PROVISIONING, name="b", private_ip=None)
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        log_in(page, site, member.user.email)
        expect(page.locator("#live")).to_have_text("live", timeout=10000)
        expect(page.locator("#desktop-count")).to_have_text("2 desktops")
        # New Computer is a primary button in sight, closed or open.
        new = page.locator("#new-computer > summary")
        expect(new).to_be_in_viewport()
        expect(new).to_have_class("button primary")
        new.click()
        expect(page.locator("#new-computer input[name=name]")).to_be_visible()
        expect(new).to_be_in_viewport()
        new.click()
        before = column_edges(page)

        desktop_progress(coming, "installing packages")
        row = page.locator(f"tr[data-desktop='{coming.id}']")
        expect(row.locator("[data-field=progress]")).to_contain_text("installing packages")
        assert column_edges(page) == before
        transition(
            desktop_id=coming.id,
            sources={DesktopState.PROVISIONING},
            target=DesktopState.ERROR,
            actor=SYSTEM,
            last_error="The engine refused the disk: no space left on the host's volume group lebureau-vg",
        )
        expect(row.locator("[data-field=state]")).to_have_text("error")
        page.wait_for_timeout(1500)  # the rows as the server renders them, after the burst
        expect(row.locator("[data-field=last_error]")).to_contain_text("no space left")
        screenshot(page, f"fleet-live-{width}")
        assert column_edges(page) == before
    finally:
        context.close()


def test_the_match_count_follows_the_filter(page, site, workspace, plan):
    member = MembershipFactory(workspace=workspace, role=Role.VIEWER)
    for name in ("alpha", "alpine", "beta"):
        DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name=name)
    log_in(page, site, member.user.email)
    expect(page.locator("#desktop-count")).to_have_text("3 desktops")
    page.fill("input[name=q]", "alp")
    page.press("input[name=q]", "Enter")
    expect(page.locator("#desktop-count")).to_have_text("2 of 3 desktops match")
    page.fill("input[name=q]", "zeta")
    page.press("input[name=q]", "Enter")
    expect(page.locator("#desktop-count")).to_have_text("0 of 3 desktops match")
    expect(page.locator("#desktop-rows")).to_contain_text("No desktop matches these filters.")
