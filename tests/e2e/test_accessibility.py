"""Every page, checked by axe-core (the accessibility engine, from npm) in real Chromium: no serious or
critical violation, signed in or not, at a desktop's width and at a phone's."""

from pathlib import Path

import pytest

from desktops import alerts
from desktops.models import DesktopState, Invitation, Role
from desktops.selectors import invitation_token
from tests.e2e.conftest import log_in
from tests.factories import DesktopFactory, MembershipFactory, api_key_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")


def violations(page) -> list[str]:
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("axe.run(document).then(r => r.violations)")
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
        for v in found
        if v["impact"] in SERIOUS
    ]


@pytest.mark.skipif(not AXE.is_file(), reason="axe-core is not installed (npm ci installs it)")
@pytest.mark.parametrize("width", [1440, 390])
def test_no_page_has_a_serious_accessibility_violation(browser, site, workspace, plan, width):
    # The pages' content security policy would refuse axe's script, injected inline.
    context = browser.new_context(
        bypass_csp=True, viewport={"width": width, "height": 900 if width > 800 else 844}
    )
    page = context.new_page()
    owner = MembershipFactory(workspace=workspace, role=Role.OWNER)
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name="a11y-desk")
    DesktopFactory(workspace=workspace, state=DesktopState.ERROR, name="a11y-broken")
    alerts.alerts_evaluate()  # an open alert on the alerts page
    api_key_for(owner)
    invited = Invitation.objects.create(workspace=workspace, email="a11y@example.com", role=Role.MEMBER)
    found = {}
    link = f"/invitations/{invitation_token(invited)}/"
    for path in ("/", "/accounts/login/", "/accounts/signup/", "/pricing/", link):
        page.goto(f"{site}{path}")
        found[path] = violations(page)
    log_in(page, site, owner.user.email)
    for path in (
        f"/w/{workspace.id}/desktops/",
        f"/w/{workspace.id}/settings/",
        f"/w/{workspace.id}/costs/",
        f"/w/{workspace.id}/audit/",
        f"/w/{workspace.id}/alerts/",
        f"/desktops/{desktop.id}/",
        "/invitations/",
        link,
    ):
        page.goto(f"{site}{path}")
        found[path] = violations(page)
    # The dialog that asks for the names of the desktops to destroy, open.
    page.goto(f"{site}/w/{workspace.id}/desktops/")
    page.check("input[data-name=a11y-desk]")
    page.click("button[value=destroy]")
    page.wait_for_selector("#destroy-dialog[open]")
    found["destroy dialog"] = violations(page)
    context.close()
    assert {path: v for path, v in found.items() if v} == {}
