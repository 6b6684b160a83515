"""Faults a deployment meets, on real processes: a worker killed -9 in the middle of a step, Redis
restarted with steps queued, PostgreSQL restarted under a step. Each test runs a control plane of its
own (tests/support/stack.py)."""

import time

import pytest
from django.conf import settings
from django.db import connection

from desktops.models import Desktop, DesktopEvent, Role
from tests.conftest import service_env
from tests.factories import api_key_for
from tests.support.desktops import wait_for_state
from tests.support.postgres import PrivateCluster, reading
from tests.support.stack import Stack
from workers.drivers.base import InstanceState, ProvisionStep

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# The states each step goes through, once each, whatever happened to its worker meanwhile.
CHAINS = {
    "provision": ["provisioning", "running"],
    "stop": ["provisioning", "running", "stopping", "stopped"],
    "destroy": ["provisioning", "running", "destroying", "destroyed"],
}
ENGINE_STATE = {
    "provision": InstanceState.RUNNING,
    "stop": InstanceState.STOPPED,
    "destroy": InstanceState.ABSENT,
}


@pytest.fixture
def stack(members, plan, driver_dir, tmp_path):
    env = service_env(driver_dir, tmp_path)
    with Stack(env, tmp_path, key=api_key_for(members[Role.MEMBER])) as stack:
        yield stack


def create(stack: Stack, name: str) -> str:
    response = stack.api.post("/api/desktops", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def states_of(desktop_id: str) -> list[str]:
    return list(
        DesktopEvent.objects.filter(desktop_id=desktop_id)
        .order_by("created_at")
        .values_list("to_state", flat=True)
    )


def wait_for_a_worker_on(desktop_id: str, *, taken: bool = True, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while Desktop.objects.filter(id=desktop_id, step_until__isnull=taken).exists():
        assert time.monotonic() < deadline, f"the step's slot was never {'taken' if taken else 'given back'}"
        time.sleep(0.05)


def wait_for_no_worker_on(desktop_id: str) -> None:
    wait_for_a_worker_on(desktop_id, taken=False, timeout=5)
    assert not Desktop.objects.get(id=desktop_id).step_holder


@pytest.mark.parametrize("step", ["provision", "stop", "destroy"])
def test_a_step_whose_worker_is_killed_midway_is_carried_out_once(stack, driver, step):
    name = f"killed-in-{step}"
    if step == "provision":
        driver.inject_fault(name, "provision", message=None, delay=4)
        desktop_id = create(stack, name)
    else:
        desktop_id = create(stack, name)
        wait_for_state(desktop_id, "running")
        driver.inject_fault(name, step, message=None, delay=4)
        path = f"/api/desktops/{desktop_id}" + ("" if step == "destroy" else f"/{step}")
        response = stack.api.delete(path) if step == "destroy" else stack.api.post(path)
        assert response.status_code == 202, response.text
    wait_for_a_worker_on(desktop_id)
    stack.kill_worker()
    stack.start_worker()
    # The killed worker's message comes back to the new worker, which carries the step out.
    wait_for_state(desktop_id, CHAINS[step][-1], timeout=60)
    assert states_of(desktop_id) == CHAINS[step]
    assert driver.status(desktop_id).state == ENGINE_STATE[step]
    wait_for_no_worker_on(desktop_id)  # the slot is given back just after the step's last write
    if step != "destroy":
        driver.destroy(desktop_id)


def test_steps_queued_when_redis_restarts_are_sent_again_by_reconcile(stack, driver):
    """Redis keeps nothing on disk: a restart loses the queued tasks, and the desktops used to sit in
    `provisioning` for ever."""
    stack.kill_worker()
    queued = [create(stack, f"queued-{i}") for i in range(3)]
    stack.restart_redis()
    stack.start_worker()
    time.sleep(2)
    assert set(Desktop.objects.filter(id__in=queued).values_list("state", flat=True)) == {"provisioning"}
    stack.env["LIFECYCLE_REQUEUE_AFTER"] = "1"
    report = stack.manage("reconcile")
    assert "requeued: 3" in report, report
    for desktop_id in queued:
        wait_for_state(desktop_id, "running", timeout=60)
        assert states_of(desktop_id) == ["provisioning", "running"]
        driver.destroy(desktop_id)


def events_of(desktop_id: str) -> list[tuple]:
    return list(
        DesktopEvent.objects.filter(desktop_id=desktop_id)
        .order_by("created_at")
        .values_list("id", "from_state", "to_state", "created_at")
    )


def test_a_postgresql_restart_under_a_provision_is_weathered_by_web_and_worker(
    members, plan, driver_dir, driver, tmp_path
):
    """PostgreSQL restarted (its own server: the machine's is shared) while a provision waits on its
    engine: the web server answers again with the connections its pool holds cut, and the worker
    writes the step's end on a new connection, once."""
    key = api_key_for(members[Role.MEMBER])
    with PrivateCluster() as postgres:
        env = service_env(driver_dir, tmp_path, DATABASE_URL=postgres.copy_of(settings.DATABASES["default"]))
        env.pop("DATABASE_CONN_MAX_AGE")  # the worker keeps its connection between tasks, as deployed
        with reading(postgres), Stack(env, tmp_path, key=key) as stack:
            running = create(stack, "up-across-the-restart")
            wait_for_state(running, "running")
            stack.api.get("/api/desktops").raise_for_status()  # the pool holds a connection now
            before = events_of(running)
            driver.inject_fault("restarted-under", "provision", message=None, delay=4)
            desktop_id = create(stack, "restarted-under")
            # Its last progress written, the step waits on the engine.
            deadline = time.monotonic() + 30
            while not Desktop.objects.filter(id=desktop_id, progress=ProvisionStep.READY).exists():
                assert time.monotonic() < deadline, "the provision never reached the engine"
                time.sleep(0.05)

            postgres.restart()
            connection.close()  # the test's own connection was cut too

            # The first request after the restart is answered, by the same web server.
            for _ in range(3):
                response = stack.api.get("/api/desktops")
                assert response.status_code == 200, response.text
            assert {d["id"] for d in response.json()["results"]} == {running, desktop_id}
            wait_for_state(desktop_id, "running", timeout=60)
            assert states_of(desktop_id) == CHAINS["provision"]
            assert driver.status(desktop_id).state == InstanceState.RUNNING
            wait_for_no_worker_on(desktop_id)
            # The desktop running throughout keeps the one interval its time is metered from.
            assert Desktop.objects.get(id=running).state == "running"
            assert events_of(running) == before
            assert stack.worker.poll() is None, "the worker survived the restart"
            for key_ in (running, desktop_id):
                driver.destroy(key_)
