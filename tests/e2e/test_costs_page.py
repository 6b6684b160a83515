"""The costs page in real Chromium: a past month of three desktops, its totals, charts and top spenders;
and the pricing page, signed out, from the sign-up page.

The desktops are rows of the directory test driver with their event log written as it happened: the
page computes everything from that log, so no engine is needed.
"""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from billing.models import StorageDay
from desktops.models import DesktopState, Role
from tests.e2e.conftest import log_in, screenshot
from tests.factories import DesktopFactory, MembershipFactory, PlanFactory, history, round_prices

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def october(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 10, day, hour, tzinfo=UTC)


def test_costs_page_charts_the_month_with_its_totals(page, site):
    owner = MembershipFactory(role=Role.OWNER)
    workspace = owner.workspace
    plan = PlanFactory()
    round_prices(plan)  # €0.10 an hour, €0.001 a GiB-hour
    alpha, beta, gamma = (
        DesktopFactory(workspace=workspace, plan=plan, name=n) for n in ("alpha", "beta", "gamma")
    )
    history(alpha, (october(1, 8), DesktopState.RUNNING), (october(1, 18), DesktopState.STOPPED))
    StorageDay.objects.create(desktop=alpha, day=october(1).date(), gib_hours=Decimal(100))
    history(
        beta,
        (october(10), DesktopState.RUNNING),
        (october(12), DesktopState.DESTROYING),
        (october(12, 1), DesktopState.DESTROYED),
    )
    history(gamma, (october(10, 12), DesktopState.RUNNING), (october(10, 14), DesktopState.SUSPENDED))

    log_in(page, site, owner.user.email)
    page.click("header.top >> text=Costs")
    while "month=2026-10" not in page.url:  # back from this month, a month at a time
        page.locator("a.button", has_text="←").click()
    expect(page.locator("h1")).to_have_text("Costs of October 2026")
    # 60 h running at €0.10, 100 GiB-hours at €0.001.
    expect(page.locator("#total-spend strong")).to_have_text("€6.10")
    expect(page.locator("#compute strong")).to_have_text("€6.00")
    expect(page.locator("#compute")).to_contain_text("60.00 h running")
    expect(page.locator("#storage strong")).to_have_text("€0.10")
    expect(page.locator("#owed strong")).to_have_text("€0.00")  # within the free tier's included €15
    expect(page.locator("#cost-chart .bar")).to_have_count(31)
    expect(page.locator("#running-chart .bar")).to_have_count(31)
    expect(page.locator("#running-chart .scale").first).to_have_text("2")  # beta and gamma on the 10th
    heights = page.locator("#cost-chart .bar rect").evaluate_all(
        "rs => rs.map(r => +r.getAttribute('height'))"
    )
    assert heights.index(max(heights)) == 9  # 10 October: 26 h running, €2.60
    expect(page.locator("#top-spenders tr").first).to_contain_text("beta")
    expect(page.locator("#top-spenders tr").first).to_contain_text("€4.80")
    expect(page.locator("#cost-table")).to_contain_text("destroyed")
    screenshot(page, "costs-01-october")
    page.set_viewport_size({"width": 390, "height": 800})
    screenshot(page, "costs-02-phone-width")


def test_pricing_page_signed_out_from_the_sign_up_page(page, site):
    round_prices(PlanFactory())
    page.goto(f"{site}/accounts/signup/")
    page.click("#signup-pricing a")
    page.wait_for_url(f"{site}/pricing/")
    expect(page.locator("#tier-free")).to_contain_text("Free")
    expect(page.locator("#tier-free")).to_contain_text("3 running at once")
    expect(page.locator("#tier-team")).to_contain_text("€29.00 a month")
    expect(page.locator("#plans")).to_contain_text("€73.00")  # starter always on: 730 h at €0.10
    expect(page.get_by_role("link", name="Sign up for free")).to_be_visible()
    screenshot(page, "costs-03-pricing")
