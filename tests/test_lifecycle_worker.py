"""The whole lifecycle through the API, a real Celery worker, Redis and PostgreSQL.

The compute engine is the directory test double; the real engines run the same
driver contract in their own suites.
"""

import sys
import time
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from desktops import alerts, lifecycle
from desktops.models import Alert, AuditEvent, Desktop, DesktopEvent, Role
from lebureau.celery import app as celery_app
from tests.conftest import (
    LIFECYCLE_NODE,
    TEST_QUEUE,
    client_for,
    node_answers,
    service_env,
    wait_for_idle_lifecycle_worker,
)
from tests.factories import DesktopFactory, SubscriptionFactory, api_key_for
from tests.support.desktops import act, wait_for_state
from tests.support.services import service_process
from workers.drivers.base import InstanceState

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def api(celery_worker, members, plan):
    yield client_for(key=api_key_for(members[Role.MEMBER]))
    # A desktop that runs sets off more work (its agent's configuration, its egress policy): it must
    # not be writing while the next test's database is emptied.
    wait_for_idle_lifecycle_worker()


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
    assert "could not be created" in desktop.last_error and "retries" in desktop.last_error
    assert desktop.error_detail == "engine busy"
    assert driver.status(desktop.id).state == "absent"


def test_failed_provision_leaves_no_orphan_and_can_be_started_again(api, driver):
    driver.inject_fault("broken", "provision", message="golden image is missing")
    desktop = wait_for_state(create(api, "broken"), "error")
    assert desktop.last_error.startswith("The desktop could not be created.")
    assert desktop.error_detail == "golden image is missing"
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
    assert desktop.last_error.startswith("The desktop could not be stopped.")
    assert desktop.error_detail == "the machine refuses to power off"
    assert alerts.alerts_evaluate() == {"error": 1}
    assert act(api, desktop_id, "destroy").status_code == 202
    wait_for_state(desktop_id, "destroyed")
    assert driver.status(desktop_id).state == "absent"
    # Its alert goes with it, resolved by the destroy step itself rather than left open in the counts.
    deadline = time.monotonic() + 10
    while (alert := Alert.objects.get(desktop_id=desktop_id)).status == "open":
        assert time.monotonic() < deadline, "the destroyed desktop's alert stayed open"
        time.sleep(0.05)
    assert (alert.status, alert.resolution) == ("resolved", "desktop_destroyed")
    assert alerts.alerts_open_count(workspace_id=desktop.workspace_id) == 0


def test_engine_failures_never_show_the_hosts_paths_or_the_clusters_names_to_tenants(api, driver, members):
    """Engines word their failures for the operators: host paths, nodes, storage. Tenants read none."""
    internals = "mount /var/lib/lebureau/desktops/x/disk.img failed on node pve-7, storage ceph-fast"
    driver.inject_fault("leaky", "provision", message=internals)
    desktop_id = create(api, "leaky")
    desktop = wait_for_state(desktop_id, "error")
    assert desktop.error_detail == internals
    owner = client_for(key=api_key_for(members[Role.OWNER]))
    audit = owner.get("/api/audit")
    assert audit.status_code == 200
    seen = [
        api.get(f"/api/desktops/{desktop_id}").content,
        api.get(f"/api/desktops/{desktop_id}/events").content,
        audit.content,
    ]
    for body in seen:
        for secret in (b"/var/lib", b"pve-7", b"ceph-fast"):
            assert secret not in body
    assert b"could not be created" in seen[0]


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
    # The work that follows a provision (the egress policy, the agent's configuration) rewrites the
    # instance: it must be over before the instance vanishes, or it brings it back.
    wait_for_idle_lifecycle_worker()
    driver.vanish(desktop_id)
    driver.plant("dsk_orphan0000000000")
    report = lifecycle.reconcile()
    assert report["vanished"] == [desktop_id]
    assert "dsk_orphan0000000000" in report["orphans"]
    assert Desktop.objects.get(id=desktop_id).state == "error"
    assert AuditEvent.objects.filter(action="reconcile.orphan", target="dsk_orphan0000000000").count() == 1
    driver.destroy("dsk_orphan0000000000")


def test_reconcile_judges_only_the_desktops_of_the_engine_installation_it_sees(workspace, driver):
    """A second control plane (a bench, another host) on the same database used to see this one's
    desktops missing from its engine and put them in error."""
    elsewhere = DesktopFactory(workspace=workspace, engine_instance="directory:/another/host")
    legacy_here = DesktopFactory(workspace=workspace, engine_instance="")
    driver.plant(legacy_here.id)
    legacy_elsewhere = DesktopFactory(workspace=workspace, engine_instance="")
    report = lifecycle.reconcile()
    assert not {elsewhere.id, legacy_elsewhere.id, legacy_here.id} & set(report["vanished"])
    assert Desktop.objects.get(id=elsewhere.id).state == "running"
    assert Desktop.objects.get(id=legacy_elsewhere.id).state == "running"
    assert Desktop.objects.get(id=legacy_here.id).engine_instance == driver.instance_id
    # Another installation's desktop is never taken for an orphan here either.
    driver.plant(elsewhere.id)
    assert elsewhere.id not in lifecycle.reconcile()["orphans"]
    for key in (legacy_here.id, elsewhere.id):
        driver.destroy(key)


def test_after_a_host_restart_reconcile_starts_running_desktops_again(api, driver):
    running = create(api, "rebooted")
    suspended = create(api, "was-suspended")
    wait_for_state(running, "running")
    wait_for_state(suspended, "running")
    act(api, suspended, "suspend")
    wait_for_state(suspended, "suspended")
    for key in (running, suspended):
        driver.power_off(key)
    report = lifecycle.reconcile()
    assert report["restarted"] == [running]
    wait_for_state(running, "running")
    assert driver.status(running).state == InstanceState.RUNNING
    events = DesktopEvent.objects.filter(desktop_id=running).order_by("created_at")
    assert list(events.values_list("to_state", flat=True))[-3:] == ["running", "starting", "running"]
    stopped = Desktop.objects.get(id=suspended)
    assert stopped.state == "stopped" and "memory" in stopped.events.order_by("created_at").last().reason
    wait_for_idle_lifecycle_worker()  # the restarted desktop's agent configuration, retried meanwhile


def stuck_in(workspace, driver, state: str, instance: InstanceState | None) -> Desktop:
    """A desktop whose worker was lost in the middle of a step, long ago."""
    desktop = DesktopFactory(workspace=workspace, state=state, engine_instance=driver.instance_id)
    if instance is not None:
        driver.plant(desktop.id, instance)
    long_ago = timezone.now() - timedelta(seconds=settings.LIFECYCLE_STUCK_AFTER + 60)
    Desktop.objects.filter(id=desktop.id).update(state_changed_at=long_ago)
    return desktop


def test_reconcile_ends_a_step_whose_worker_was_lost(workspace, driver):
    done_behind_our_back = stuck_in(workspace, driver, "stopping", InstanceState.STOPPED)
    lost = stuck_in(workspace, driver, "starting", None)
    half_destroyed = stuck_in(workspace, driver, "destroying", InstanceState.STOPPED)
    under_way = stuck_in(workspace, driver, "stopping", InstanceState.RUNNING)
    Desktop.objects.filter(id=under_way.id).update(step_until=timezone.now() + timedelta(minutes=5))
    report = lifecycle.reconcile()
    assert set(report["stuck"]) >= {done_behind_our_back.id, lost.id, half_destroyed.id}
    assert under_way.id not in report["stuck"]
    assert Desktop.objects.get(id=done_behind_our_back.id).state == "stopped"
    failed = Desktop.objects.get(id=lost.id)
    assert failed.state == "error" and "did not finish" in failed.last_error
    assert Desktop.objects.get(id=half_destroyed.id).state == "destroyed"
    assert driver.status(half_destroyed.id).state == InstanceState.ABSENT
    assert Desktop.objects.get(id=under_way.id).state == "stopping"
    for desktop in (done_behind_our_back, under_way):
        driver.destroy(desktop.id)


def test_reconcile_removes_an_orphan_only_after_its_grace(db, driver):
    driver.plant("dsk_orphan1111111111")
    assert "dsk_orphan1111111111" in lifecycle.reconcile()["orphans"]
    assert "dsk_orphan1111111111" not in lifecycle.reconcile()["removed"]
    assert driver.status("dsk_orphan1111111111").state == InstanceState.RUNNING
    with time_machine.travel(timezone.now() + timedelta(seconds=settings.ORPHAN_GRACE + 1)):
        assert "dsk_orphan1111111111" in lifecycle.reconcile()["removed"]
    assert driver.status("dsk_orphan1111111111").state == InstanceState.ABSENT
    assert AuditEvent.objects.filter(
        action="reconcile.orphan_removed", target="dsk_orphan1111111111"
    ).exists()


def test_a_workspace_takes_at_most_its_share_of_lifecycle_slots(members, workspace, settings):
    settings.LIFECYCLE_STEPS_PER_WORKSPACE = 2
    busy = [DesktopFactory(workspace=workspace, state="provisioning") for _ in range(4)]

    def slot(desktop, holder="task"):
        return lifecycle.desktop_step_slot(desktop_id=desktop.id, seconds=60, holder=f"{holder}-{desktop.id}")

    def free(desktop, holder="task"):
        lifecycle.desktop_step_slot_free(desktop_id=desktop.id, holder=f"{holder}-{desktop.id}")

    assert slot(busy[0]) and slot(busy[1])
    # Nobody else waits: the cap does not hold the burst back.
    assert slot(busy[3])
    free(busy[3])
    # Another workspace's step is queued: this workspace keeps to its share, and the other goes first.
    waiting = DesktopFactory(state="stopping")
    assert not slot(busy[2])
    assert slot(waiting), "another workspace waited"
    free(busy[0])
    assert slot(busy[2])
    # A slot whose worker died (past its time limit) is not counted for ever.
    Desktop.objects.filter(id__in=[busy[1].id, busy[2].id]).update(step_until=timezone.now())
    assert slot(busy[0])


def test_one_step_at_a_time_on_a_desktop_but_a_redelivered_message_takes_its_own_over(workspace):
    desktop = DesktopFactory(workspace=workspace, state="stopping")
    assert lifecycle.desktop_step_slot(desktop_id=desktop.id, seconds=60, holder="first")
    # A copy of the step sent again by reconcile waits while the first is under way…
    assert not lifecycle.desktop_step_slot(desktop_id=desktop.id, seconds=60, holder="copy")
    # …the first's own message, redelivered after its worker died, carries on at once…
    assert lifecycle.desktop_step_slot(desktop_id=desktop.id, seconds=60, holder="first")
    # …and only the holder frees the slot.
    lifecycle.desktop_step_slot_free(desktop_id=desktop.id, holder="copy")
    assert not lifecycle.desktop_step_slot(desktop_id=desktop.id, seconds=60, holder="copy")
    lifecycle.desktop_step_slot_free(desktop_id=desktop.id, holder="first")
    assert lifecycle.desktop_step_slot(desktop_id=desktop.id, seconds=60, holder="copy")


def test_one_tenants_burst_of_creates_does_not_hold_up_anothers_stop(
    api, driver, members, celery_worker, driver_dir, tmp_path_factory
):
    """Fifty creates from one workspace used to fill every worker slot: another tenant's stop waited
    behind them all. A workspace now takes at most LIFECYCLE_STEPS_PER_WORKSPACE slots while another
    workspace's step waits."""
    # A tier that lets this workspace run the whole burst: the free tier's cap is not under test.
    SubscriptionFactory(workspace=members[Role.MEMBER].workspace)
    other = client_for(key=api_key_for(members["outsider"]))
    response = other.post("/api/desktops", {"name": "elsewhere"}, format="json")
    other_id = response.json()["id"]
    wait_for_state(other_id, "running")
    node = next(
        n for reply in celery_app.control.ping(timeout=1) for n in reply if n.startswith(f"{LIFECYCLE_NODE}@")
    )
    celery_app.control.cancel_consumer(TEST_QUEUE, destination=[node], reply=True)
    basetemp = tmp_path_factory.getbasetemp()
    env = service_env(driver_dir, basetemp, LIFECYCLE_STEPS_PER_WORKSPACE="1", DRIVER_RETRY_MAX="2")
    args = [sys.executable, "-m", "celery", "-A", "lebureau", "worker", "-Q", TEST_QUEUE, "-c", "2"]
    try:
        with service_process(
            "fair-worker",
            [*args, "-n", f"fair-{TEST_QUEUE}@%h"],
            env,
            basetemp,
            lambda: node_answers(f"fair-{TEST_QUEUE}"),
        ):
            busy = []
            for i in range(6):
                driver.inject_fault(f"busy-{i}", "provision", message=None, delay=1.5)
                busy.append(create(api, f"busy-{i}"))
            assert act(other, other_id, "stop").status_code == 202
            wait_for_state(other_id, "stopped", timeout=30)
            still_provisioning = Desktop.objects.filter(id__in=busy, state="provisioning").count()
            assert still_provisioning >= 4, "the other tenant's stop waited behind the burst"
            for desktop_id in busy:
                wait_for_state(desktop_id, "running", timeout=60)
    finally:
        celery_app.control.add_consumer(TEST_QUEUE, destination=[node], reply=True)
