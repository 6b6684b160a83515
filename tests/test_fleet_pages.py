"""Mission Control's fleet: labels on the desktops page (filter, add, remove) and schedules on a desktop's
page, for those who may, and never across workspaces."""

import pytest
from django.test import Client

from desktops.models import DesktopLabel, Role, Schedule
from tests.factories import DesktopFactory

pytestmark = pytest.mark.django_db


def browser(membership) -> Client:
    client = Client()
    client.force_login(membership.user)
    return client


def test_the_fleet_is_labelled_and_filtered_by_label_within_its_workspace(workspace, members, plan):
    mine = [DesktopFactory(workspace=workspace, plan=plan, name=f"web-{i}") for i in range(3)]
    foreign = DesktopFactory(workspace=members["outsider"].workspace, plan=plan, name="foreign")
    DesktopLabel.objects.create(desktop=foreign, name="ci")
    page = browser(members[Role.MEMBER])
    url = f"/w/{workspace.id}/desktops/actions/"

    added = page.post(
        url, {"action": "label", "label": "CI", "desktops": [mine[0].id, mine[1].id]}, follow=True
    )
    assert "ci: 2 desktops changed." in added.content.decode()
    # A desktop of another workspace is not among the choices: the whole action is refused.
    page.post(url, {"action": "label", "label": "ci", "desktops": [mine[2].id, foreign.id]})
    assert not mine[2].labels.exists() and list(foreign.labels.values_list("name", flat=True)) == ["ci"]

    listed = page.get(f"/w/{workspace.id}/desktops/?label=ci").content.decode()
    assert "web-0" in listed and "web-1" in listed and "web-2" not in listed and "foreign" not in listed
    page.post(url, {"action": "unlabel", "label": "ci", "desktops": [mine[0].id]})
    assert list(
        DesktopLabel.objects.filter(desktop__workspace=workspace).values_list("desktop__name", flat=True)
    ) == ["web-1"]
    assert (
        browser(members[Role.MEMBER]).post(url, {"action": "label", "desktops": [mine[2].id]}).status_code
        == 302
    )
    assert not mine[2].labels.exists()  # no label typed: nothing done
    assert (
        browser(members[Role.VIEWER])
        .post(url, {"action": "label", "label": "x", "desktops": [mine[2].id]})
        .status_code
        == 403
    )


def test_schedules_are_set_on_a_desktops_page_by_those_who_may_take_control(workspace, members, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan)
    form = {"cron": "0 9 * * 1-5", "timezone": "Europe/Paris", "message": "Bilan du jour", "stop_after": "on"}
    url = f"/desktops/{desktop.id}/schedules/new/"

    assert browser(members["outsider"]).post(url, form).status_code == 404
    browser(members[Role.VIEWER]).post(url, form)
    assert not Schedule.objects.exists()
    made = browser(members[Role.MEMBER]).post(url, form)
    assert made.status_code == 302 and made["Location"].endswith("#schedules-panel")
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone, schedule.stop_after) == ("0 9 * * 1-5", "Europe/Paris", True)

    page = browser(members[Role.VIEWER]).get(f"/desktops/{desktop.id}/").content.decode()
    assert "Bilan du jour" in page and "0 9 * * 1-5" in page and 'value="delete"' not in page
    change = f"/schedules/{schedule.id}/"
    browser(members[Role.VIEWER]).post(change, {"change": "delete"})
    assert Schedule.objects.exists()
    browser(members[Role.MEMBER]).post(change, {"change": "pause"})
    schedule.refresh_from_db()
    assert not schedule.enabled and schedule.next_run_at is None
    browser(members[Role.MEMBER]).post(change, {"change": "delete"})
    assert not Schedule.objects.exists()
