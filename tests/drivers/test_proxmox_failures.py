"""How the Proxmox driver meets PVE's failures, races and a full cluster (against the simulator)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from proxmoxer import ResourceException

from tests.pve.simulator import TaskTimes
from tests.pve.support import SLOW_TASK, TEMPLATE, driver_for, make_spec, needs_schema, simulator
from workers.drivers.base import DriverError, InstanceState, TransientDriverError

pytestmark = needs_schema


@pytest.fixture
def pve(sim):
    return driver_for(sim)


def test_the_simulator_validates_requests_against_the_schema(pve):
    vm = pve.api.nodes("pve1").qemu(TEMPLATE)
    with pytest.raises(ResourceException) as raised:
        vm.config.put(cores=0, bogus=1, agent="true")
    assert raised.value.status_code == 400
    assert raised.value.content == "Parameter verification failed."
    assert set(raised.value.errors) == {"cores", "bogus", "agent"}
    with pytest.raises(ResourceException) as raised:
        vm.clone.post(name="no_underscores")  # newid is missing, name is not a DNS name
    assert set(raised.value.errors) == {"newid", "name"}
    with pytest.raises(ResourceException) as raised:
        pve.api.nodes("pve1").qemu(TEMPLATE).nonsense.get()
    assert raised.value.status_code == 501


def test_a_failed_task_surfaces_pves_message_and_is_permanent(sim, pve):
    sim.fail_task("qmstart", "start failed: QEMU exited with code 1")
    with pytest.raises(DriverError) as raised:
        pve.provision(make_spec())
    assert not raised.value.transient
    assert "start failed: QEMU exited with code 1" in raised.value.message


def test_a_start_of_a_running_vm_fails_in_its_task_as_in_pve(sim, pve):
    spec = make_spec()
    vmid = int(pve.provision(spec).ref)
    upid = pve.api.nodes("pve1").qemu(vmid).status.start.post()
    task = pve.api.nodes("pve1").tasks(upid).status.get()
    assert (task["type"], task["status"]) == ("qmstart", "stopped")
    assert task["exitstatus"] == f"VM {vmid} already running"


def slow_starts(sim, pve, spec) -> int:
    """A stopped desktop whose start tasks last long enough for a second start to queue behind one."""
    vmid = int(pve.provision(spec).ref)
    pve.stop(spec.key)
    sim.times = TaskTimes(start=SLOW_TASK)
    return vmid


def start_exits(sim, vmid: int) -> list[str]:
    return [t.exitstatus for t in sim.tasks.values() if t.kind == "qmstart" and t.vmid == vmid]


def test_a_start_retried_after_its_answer_was_lost_ends_running(sim, pve):
    spec = make_spec()
    vmid = slow_starts(sim, pve, spec)
    sim.lose_answers("POST", r"/status/start$")
    with pytest.raises(TransientDriverError, match="did not answer"):
        pve.start(spec.key)
    # The lost start is still under way, so the VM reads stopped and the retry starts it again.
    assert pve.start(spec.key).state == InstanceState.RUNNING
    assert start_exits(sim, vmid)[-2:] == ["OK", f"VM {vmid} already running"]


def test_a_start_racing_another_ends_running(sim, pve):
    spec = make_spec()
    vmid = slow_starts(sim, pve, spec)
    pve.api.nodes("pve1").qemu(vmid).status.start.post()  # another worker's start
    status = pve.start(spec.key)
    assert status.state == InstanceState.RUNNING and status.private_ip
    assert start_exits(sim, vmid)[-1] == f"VM {vmid} already running"


def test_a_resume_retried_after_its_answer_was_lost_ends_running(sim, pve):
    spec = make_spec()
    pve.provision(spec)
    pve.suspend(spec.key)
    sim.times = TaskTimes(resume=SLOW_TASK)
    sim.lose_answers("POST", r"/status/resume$")
    with pytest.raises(TransientDriverError, match="did not answer"):
        pve.resume(spec.key)
    # The lost resume is still under way, so the retry resumes again: PVE resumes a running VM as a no-op.
    assert pve.resume(spec.key).state == InstanceState.RUNNING
    assert [t.exitstatus for t in sim.tasks.values() if t.kind == "qmresume"] == ["OK", "OK"]


def test_task_warnings_count_as_success(sim, pve):
    sim.fail_task("qmclone", "WARNINGS: 2")
    assert pve.provision(make_spec()).state == InstanceState.RUNNING


def test_a_failed_clone_leaves_nothing(sim, pve):
    spec = make_spec()
    sim.fail_task("qmclone", "clone failed: storage 'local-lvm' is full")
    with pytest.raises(DriverError, match="storage 'local-lvm' is full"):
        pve.provision(spec)
    assert pve.status(spec.key).state == InstanceState.ABSENT


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, "VM is locked (backup)"),
        (500, "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout"),
        (503, "Service Unavailable"),
        (595, "Errors during connection establishment, proxy handshake failed"),
    ],
)
def test_locks_timeouts_and_unavailability_are_transient(sim, pve, status, message):
    spec = make_spec()
    pve.provision(spec)
    pve.stop(spec.key)
    sim.fail_request("POST", r"/status/start$", status, message)
    with pytest.raises(TransientDriverError) as raised:
        pve.start(spec.key)
    assert message in raised.value.message
    assert pve.start(spec.key).state == InstanceState.RUNNING


def test_a_lock_timeout_inside_a_task_is_transient(sim, pve):
    sim.fail_task("qmclone", "can't lock file '/var/lock/qemu-server/lock-9000.conf' - got timeout")
    with pytest.raises(TransientDriverError, match="got timeout"):
        pve.provision(make_spec())


def test_a_vm_locked_by_someone_else_is_transient(sim, pve):
    spec = make_spec()
    vm = sim.vms[int(pve.provision(spec).ref)]
    vm.config["lock"] = "backup"
    with pytest.raises(TransientDriverError, match=r"locked \(backup\)"):
        pve.stop(spec.key)
    del vm.config["lock"]
    assert pve.stop(spec.key).state == InstanceState.STOPPED


def test_other_refusals_are_permanent_with_pves_words(sim, pve):
    sim.fail_request("POST", r"/clone$", 500, "storage 'fast-ssd' does not exist")
    with pytest.raises(DriverError) as raised:
        pve.provision(make_spec())
    assert not raised.value.transient
    assert "storage 'fast-ssd' does not exist" in raised.value.message


def test_a_missing_template_is_a_clear_permanent_error(sim):
    pve = driver_for(sim, templates={"minimal": 9999})
    with pytest.raises(DriverError, match=r"template VM 9999 .* missing"):
        pve.provision(make_spec())
    with pytest.raises(DriverError, match="no Proxmox template for the image profile 'full'"):
        pve.provision(make_spec(image_profile="full"))


def test_a_wrong_token_is_refused(sim):
    pve = driver_for(sim, token_secret="not-the-secret")
    with pytest.raises(DriverError) as raised:
        pve.status(make_spec().key)
    assert not raised.value.transient
    assert "authentication failure" in raised.value.message


def test_a_token_without_the_privilege_gets_pves_permission_error(sim, pve):
    sim.privileges = {"VM.Audit", "VM.Allocate", "VM.Config.Disk", "VM.PowerMgmt"}  # no VM.Clone
    with pytest.raises(DriverError) as raised:
        pve.provision(make_spec())
    assert not raised.value.transient
    assert f"Permission check failed (/vms/{TEMPLATE}, VM.Clone)" in raised.value.message


def test_the_nextid_race_retries_with_another_vmid(sim, pve):
    sim.steal_next_ids(2)
    status = pve.provision(make_spec())
    assert status.state == InstanceState.RUNNING
    assert sim.vms[int(status.ref)].config["name"].startswith("dsk-")
    clones = [p["newid"] for m, path, p in sim.requests if path.endswith("/clone")]
    assert len(clones) == 3 and len(set(clones)) == 3


def test_concurrent_creates_all_get_their_own_vm():
    sim = simulator({"pve1": (65536, 16), "pve2": (65536, 16), "pve3": (65536, 16)}, TaskTimes(clone=0.05))
    pve = driver_for(sim)
    try:
        specs = [make_spec() for _ in range(12)]
        with ThreadPoolExecutor(12) as pool:
            statuses = list(pool.map(pve.provision, specs))
        assert len({s.ref for s in statuses}) == 12
        assert {sim.vms[int(s.ref)].node for s in statuses} == {"pve1", "pve2", "pve3"}
        assert sorted(i.key for i in pve.list_instances()) == sorted(s.key for s in specs)
    finally:
        sim.stop()


def test_a_late_guest_agent_is_waited_for(sim):
    sim.times = TaskTimes(agent=0.3)
    pve = driver_for(sim)
    began = time.monotonic()
    status = pve.provision(make_spec())
    assert status.private_ip and time.monotonic() - began >= 0.3
    asked = [path for m, path, p in sim.requests if path.endswith("network-get-interfaces")]
    assert len(asked) > 1


def test_a_guest_agent_that_never_answers_times_out_transiently(sim):
    sim.times = TaskTimes(agent=60)
    pve = driver_for(sim, agent_timeout=0.2)
    with pytest.raises(TransientDriverError, match=r"network did not come up with .* within"):
        pve.provision(make_spec())


def test_a_guest_that_ignores_shutdown_is_stopped_hard(sim, pve):
    spec = make_spec()
    sim.vms[int(pve.provision(spec).ref)].ignores_shutdown = True
    assert pve.stop(spec.key).state == InstanceState.STOPPED
    powered = [path.rsplit("/", 1)[1] for m, path, p in sim.requests if "/status/s" in path and m == "POST"]
    assert powered[-2:] == ["shutdown", "stop"]


def test_destroy_of_a_running_or_suspended_vm(sim, pve):
    spec = make_spec()
    pve.provision(spec)
    pve.suspend(spec.key)
    pve.destroy(spec.key)
    assert pve.status(spec.key).state == InstanceState.ABSENT


def test_a_three_node_cluster_fills_up_then_says_no_capacity():
    # 10 GiB nodes, 2 GiB of which the host uses, minus a 2 GiB reserve: three 2 GiB desktops each.
    sim = simulator({"pve1": (10240, 8), "pve2": (10240, 8), "pve3": (10240, 8)})
    pve = driver_for(sim, memory_reserve_mib=2048)
    try:
        nodes = [sim.vms[int(pve.provision(make_spec(memory_mib=2048)).ref)].node for _ in range(9)]
        assert sorted(nodes[:3]) == ["pve1", "pve2", "pve3"], "the first three did not spread"
        assert sorted(nodes) == ["pve1"] * 3 + ["pve2"] * 3 + ["pve3"] * 3
        # Clones to other nodes than the template's name their target.
        targets = {p.get("target") for m, path, p in sim.requests if path.endswith("/clone")}
        assert targets == {None, "pve2", "pve3"}
        with pytest.raises(DriverError) as raised:
            pve.provision(make_spec(memory_mib=2048))
        assert not raised.value.transient
        assert raised.value.message.startswith("no capacity: no Proxmox node has 2048 MiB")
        assert "pve1: 0 MiB and 29 vCPUs free" in raised.value.message
    finally:
        sim.stop()


def test_an_offline_node_gets_nothing():
    sim = simulator({"pve1": (65536, 16), "pve2": (65536, 16)})
    sim.nodes["pve2"]["online"] = False
    pve = driver_for(sim)
    try:
        assert {sim.vms[int(pve.provision(make_spec()).ref)].node for _ in range(3)} == {"pve1"}
    finally:
        sim.stop()
