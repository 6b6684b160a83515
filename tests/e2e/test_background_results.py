"""What happens in the background reaches the person on whichever page of the workspace they are, in
real Chromium: a toast when a desktop's step ends (run by the suite's real Celery worker, on the
directory test engine), and secrets shown once are copied in one click."""

import pytest
from playwright.sync_api import expect

from desktops import services
from desktops.audit import Actor
from desktops.models import Role
from tests.conftest import wait_for_idle_lifecycle_worker
from tests.e2e.conftest import log_in, screenshot
from tests.factories import MembershipFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.worker]


def test_a_desktops_step_ending_is_toasted_on_any_page(page, site, celery_worker, workspace, plan):
    wait_for_idle_lifecycle_worker()  # what earlier tests set off must not hold the worker's slots
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    actor = Actor(user=member.user)
    log_in(page, site, member.user.email)
    toasts = page.locator("#toasts .toast")
    listening = page.locator("#toasts[data-listening]")
    try:
        # Steps set off elsewhere (here through the services, as the API does) once the page listens.
        expect(listening).to_have_count(1, timeout=10000)
        services.desktop_create(
            actor=actor, workspace=workspace, plan=plan, name="toasted", image_profile="minimal"
        )
        expect(toasts.filter(has_text="toasted is running.")).to_have_count(1, timeout=60000)
        expect(page.locator("tr", has_text="toasted").locator("[data-field=state]")).to_have_text("running")
        screenshot(page, "toast-01-running")

        # On another page of the workspace too.
        page.goto(f"{site}/w/{workspace.id}/settings/")
        expect(toasts).to_have_count(0)
        expect(listening).to_have_count(1, timeout=10000)
        services.desktop_act(actor=actor, desktop=workspace.desktops.get(name="toasted"), action="stop")
        stopped = toasts.filter(has_text="toasted is stopped.")
        expect(stopped).to_have_count(1, timeout=60000)
        screenshot(page, "toast-02-stopped-on-settings")
        stopped.get_by_role("button", name="Dismiss").click()
        expect(stopped).to_have_count(0)
    finally:
        wait_for_idle_lifecycle_worker()


def test_the_desktops_list_catches_up_with_a_step_over_before_it_listened(
    page, site, celery_worker, workspace, plan
):
    """New Computer on a quick engine: the step may be over before the next page's stream is open."""
    wait_for_idle_lifecycle_worker()
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    log_in(page, site, member.user.email)
    try:
        page.fill("input[name=name]", "quick")
        page.select_option("select[name=image_profile]", "minimal")
        page.click("#new-computer button[type=submit]")
        expect(page.locator("tr", has_text="quick").locator("[data-field=state]")).to_have_text(
            "running", timeout=60000
        )
    finally:
        wait_for_idle_lifecycle_worker()
