"""Alerts in real Chromium on a real LXC desktop: a process filling the desktop's memory past the
workspace's threshold raises an alert (the rules run in the suite's Celery worker), which appears live
on the open alerts page, is acknowledged there, and is not raised again while the memory stays full."""

import time

import pytest
from playwright.sync_api import expect

from desktops import alerts
from desktops.engines import desktop_resource_usage
from desktops.models import Alert, Role
from lebureau.celery import app as celery_app
from tests.conftest import LXC_IMAGE, client_for
from tests.e2e.conftest import log_in, screenshot
from tests.factories import MembershipFactory, api_key_for
from tests.support.desktops import provision, run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no minimal golden image (make setup builds it)"),
]
MIB = 1024**2
# Bytes written, not only reserved: every page of it is resident.
FILL = "nohup python3 -c 'import time; held = b\"x\" * (900 * 2**20); time.sleep(600)' >/dev/null 2>&1 &"


def test_memory_filled_past_the_threshold_raises_an_alert_live_acknowledged_once(
    page, site, lxc_api, workspace, members
):
    admin = client_for(key=api_key_for(members[Role.ADMIN]))
    thresholds = {"alertThresholds": {"memoryPercent": 25, "sustainedSeconds": 0}}
    assert admin.patch(f"/api/workspaces/{workspace.id}", thresholds, format="json").status_code == 200
    desktop = provision(lxc_api, "hungry")
    limit = desktop.plan.memory_mib * MIB // 4
    assert alerts.alerts_evaluate() == {}, "the desktop already uses a quarter of its memory"
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    log_in(page, site, member.user.email)
    page.goto(f"{site}/w/{workspace.id}/alerts/")
    expect(page.locator("#alerts")).to_contain_text("No alert.")

    run(desktop, FILL)
    deadline = time.monotonic() + 60
    # Filling memory also burns CPU: with no sustained time, a CPU alert may come too; this is about memory.
    while not Alert.objects.filter(desktop=desktop, kind="memory").exists():
        assert time.monotonic() < deadline, "no alert raised"
        celery_app.send_task("workers.tasks.alerts_evaluate")
        time.sleep(2)
    raised = page.locator("#alerts li.alert.open", has_text="of its plan's memory")
    expect(raised).to_contain_text("hungry uses", timeout=15000)
    expect(raised).to_contain_text("of its plan's memory (alert from 25%)")
    screenshot(page, "alerts-01-raised")

    raised.locator("button[name=acknowledge]").click()
    expect(raised).to_have_count(0, timeout=15000)
    screenshot(page, "alerts-02-acknowledged")
    alert = Alert.objects.get(desktop=desktop, kind="memory")
    assert (alert.kind, alert.status, alert.acknowledged_by) == ("memory", "acknowledged", member.user)
    # Still full, the same spell: not raised again.
    assert desktop_resource_usage(desktop).memory_bytes > limit
    assert "memory" not in alerts.alerts_evaluate()
    assert Alert.objects.filter(desktop=desktop, kind="memory").count() == 1
