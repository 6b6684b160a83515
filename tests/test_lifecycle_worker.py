"""The whole lifecycle through the API, a real Celery worker, Redis and PostgreSQL.

The compute engine is the directory test double; the real engines run the same
driver contract in their own suites.
"""

import time

import pytest

from desktops import lifecycle
from desktops.models import AuditEvent, Desktop, DesktopEvent, Role
from tests.conftest import client_for
from tests.factories import api_key_for
from tests.support.desktops import act, wait_for_state

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def api(celery_worker, members, plan):
    return client_for(key=api_key_for(members[Role.MEMBER]))


def create(api, name="agent-01"):
    response = api.post("/api/desktops", {"name": name}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_full_lifecycle(api, driver):
    desktop_id = create(api)
    desktop = wait_for_state(desktop_id, "running")
    assert desktop.private_ip and desktop.driver_ref
    assert driver.status(desktop_id).state == "running"

    for step, via, final in [
        ("stop", "stopping", "stopped"),
        ("start", "starting", "running"),
        ("suspend", "suspending", "suspended"),
        ("resume", "resuming", "running"),
        ("destroy", "destroying", "destroyed"),
    ]:
        response = act(api, desktop_id, step)
        assert response.status_code == 202, response.content
        assert response.json()["state"] in (via, final)
        wait_for_state(desktop_id, final)
        assert driver.status(desktop_id).state == ("absent" if step == "destroy" else final)

    states = list(DesktopEvent.objects.filter(desktop_id=desktop_id).values_list("to_state", flat=True))
    assert states == [
        "provisioning",
        "running",
        "stopping",
        "stopped",
        "starting",
        "running",
        "suspending",
        "suspended",
        "resuming",
        "running",
        "destroying",
        "destroyed",
    ]
    # The name is free again once the desktop is destroyed.
    wait_for_state(create(api), "running")
    steps = AuditEvent.objects.filter(target=desktop_id, actor="system:worker").values_list(
        "action", flat=True
    )
    assert set(steps) >= {"desktop.running", "desktop.stopped", "desktop.suspended", "desktop.destroyed"}


def test_illegal_transition_is_a_409_naming_the_state(api):
    desktop_id = create(api)
    wait_for_state(desktop_id, "running")
    response = act(api, desktop_id, "resume")
    assert response.status_code == 409
    assert "running" in response.json()["error"]["message"]
    assert Desktop.objects.get(id=desktop_id).state == "running"


def test_transient_errors_are_retried(api, driver):
    driver.inject_fault("flaky", "provision", transient=True, times=2, message="engine busy")
    desktop = wait_for_state(create(api, "flaky"), "running", "error")
    assert desktop.state == "running", desktop.last_error


def test_transient_errors_give_up_into_error(api, driver):
    driver.inject_fault("stuck", "provision", transient=True, times=10, message="engine busy")
    desktop = wait_for_state(create(api, "stuck"), "error")
    assert "engine busy" in desktop.last_error and "retries" in desktop.last_error
    assert driver.status(desktop.id).state == "absent"


def test_failed_provision_leaves_no_orphan_and_can_be_started_again(api, driver):
    driver.inject_fault("broken", "provision", message="golden image is missing")
    desktop = wait_for_state(create(api, "broken"), "error")
    assert desktop.last_error == "golden image is missing"
    assert driver.status(desktop.id).state == "absent"
    assert act(api, desktop.id, "start").status_code == 202
    desktop = wait_for_state(desktop.id, "running")
    assert driver.status(desktop.id).state == "running"


def test_permanent_step_failure_puts_the_desktop_in_error_then_destroy_works(api, driver):
    desktop_id = create(api, "wont-stop")
    wait_for_state(desktop_id, "running")
    driver.inject_fault("wont-stop", "stop", message="the machine refuses to power off")
    act(api, desktop_id, "stop")
    desktop = wait_for_state(desktop_id, "error")
    assert desktop.last_error == "the machine refuses to power off"
    assert act(api, desktop_id, "destroy").status_code == 202
    wait_for_state(desktop_id, "destroyed")
    assert driver.status(desktop_id).state == "absent"


def test_destroy_during_provision_leaves_nothing_behind(api, driver):
    driver.inject_fault("slow", "provision", message=None, delay=1.5)
    desktop_id = create(api, "slow")
    time.sleep(0.3)
    assert act(api, desktop_id, "destroy").status_code == 202
    wait_for_state(desktop_id, "destroyed")
    time.sleep(2)  # let the overtaken provision finish
    assert Desktop.objects.get(id=desktop_id).state == "destroyed"
    assert driver.status(desktop_id).state == "absent"


def test_reconcile_reports_orphans_and_vanished_desktops(api, driver):
    desktop_id = create(api, "will-vanish")
    wait_for_state(desktop_id, "running")
    driver.vanish(desktop_id)
    driver.plant("dsk_orphan0000000000")
    report = lifecycle.reconcile()
    assert report["vanished"] == [desktop_id]
    assert "dsk_orphan0000000000" in report["orphans"]
    assert Desktop.objects.get(id=desktop_id).state == "error"
    assert AuditEvent.objects.filter(action="reconcile.orphan", target="dsk_orphan0000000000").count() == 1
    driver.destroy("dsk_orphan0000000000")
