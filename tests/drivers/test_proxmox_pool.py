"""The Proxmox driver's warm pool against the simulator: refill, claim, personalise, the claim race."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.pve.simulator import TaskTimes
from tests.pve.support import SLOW_TASK, driver_for, make_spec, needs_schema, simulator
from workers.drivers.base import InstanceState, TransientDriverError
from workers.drivers.proxmox import PoolShape
from workers.drivers.proxmox.pool import POOL_TAG

pytestmark = needs_schema
SHAPE = PoolShape("minimal", 1, 1024, 10, size=1)


@pytest.fixture
def sim():
    sim = simulator({"pve1": (65536, 16), "pve2": (65536, 16)})
    yield sim
    sim.stop()


def pool_vms(sim):
    return [vm for vm in sim.vms.values() if POOL_TAG in vm.config.get("tags", "")]


def clones(sim) -> int:
    return sum(1 for m, path, p in sim.requests if path.endswith("/clone"))


def test_shapes_parse_from_settings():
    assert PoolShape.parse("full:2:4096:20=3") == PoolShape("full", 2, 4096, 20, 3)
    with pytest.raises(ValueError, match="expected profile"):
        PoolShape.parse("full:2:4096")


def test_refill_makes_booted_members_on_every_node_and_hides_them(sim):
    pve = driver_for(sim, warm_pool=(SHAPE,))
    assert pve.refill_pool() == {SHAPE.tag: 2}
    members = pool_vms(sim)
    assert sorted(vm.node for vm in members) == ["pve1", "pve2"]
    assert all(vm.status == "running" and vm.fw_options["enable"] == "1" for vm in members)
    assert pve.list_instances() == []
    assert pve.refill_pool() == {SHAPE.tag: 0}


def test_a_create_claims_a_booted_member_without_cloning(sim):
    pve = driver_for(sim, warm_pool=(SHAPE,))
    pve.refill_pool()
    made = clones(sim)
    spec = make_spec(memory_mib=1024, disk_gib=10)
    status = pve.provision(spec)
    assert clones(sim) == made
    vm = sim.vms[int(status.ref)]
    assert (vm.config["name"], vm.config["tags"]) == (spec.key.replace("_", "-"), f"lebureau;{spec.key}")
    assert pve.guest_setup.calls == [(spec.key, status.private_ip, spec.files)]
    assert pve.refill_pool() == {SHAPE.tag: 1}
    # A plan the pool does not hold is cloned as usual.
    pve.provision(make_spec(memory_mib=2048))
    assert clones(sim) == made + 2


def test_a_booted_member_is_not_given_to_a_create_with_another_key(sim):
    pve = driver_for(sim, warm_pool=(SHAPE,))
    pve.refill_pool()
    made = clones(sim)
    pve.provision(make_spec(ssh_public_key="ssh-ed25519 AAAAOTHER other"))
    assert clones(sim) == made + 1


def test_stopped_members_are_personalised_by_cloud_init(sim):
    pve = driver_for(sim, warm_pool=(SHAPE,), warm_pool_running=False)
    pve.refill_pool()
    assert all(vm.status == "stopped" for vm in pool_vms(sim))
    spec = make_spec(ssh_public_key="ssh-ed25519 AAAAOTHER other")
    status = pve.provision(spec)
    assert status.state == InstanceState.RUNNING
    assert sim.vms[int(status.ref)].config["sshkeys"] == "ssh-ed25519%20AAAAOTHER%20other"


def test_a_provision_retried_after_its_boot_answer_was_lost_ends_running(sim):
    pve = driver_for(sim, warm_pool=(SHAPE,), warm_pool_running=False)
    pve.refill_pool()
    made = clones(sim)
    sim.times = TaskTimes(start=SLOW_TASK)
    sim.lose_answers("POST", r"/status/start$")
    spec = make_spec()
    with pytest.raises(TransientDriverError, match="did not answer"):
        pve.provision(spec)
    # The retry finds its claimed member still starting and starts it again.
    status = pve.provision(spec)
    assert status.state == InstanceState.RUNNING and POOL_TAG not in sim.vms[int(status.ref)].config["tags"]
    starts = [t.exitstatus for t in sim.tasks.values() if t.kind == "qmstart" and t.vmid == int(status.ref)]
    assert starts == ["OK", f"VM {status.ref} already running"]
    assert clones(sim) == made


def test_shrinking_the_pool_removes_members(sim):
    pve = driver_for(sim, warm_pool=(SHAPE,))
    pve.refill_pool()
    smaller = driver_for(sim, warm_pool=(PoolShape("minimal", 1, 1024, 10, size=0),))
    assert smaller.refill_pool() == {SHAPE.tag: -2}
    assert pool_vms(sim) == []


def test_two_creates_racing_for_one_member_never_share_it():
    sim = simulator()
    pve = driver_for(sim, warm_pool=(SHAPE,))
    try:
        pve.refill_pool()
        (member,) = pool_vms(sim)
        # Both read the member's config (and digest) before either writes its claim.
        sim.delay_requests("GET", rf"/qemu/{member.vmid}/config$", 0.2)
        specs = [make_spec(), make_spec()]
        with ThreadPoolExecutor(2) as pool:
            statuses = list(pool.map(pve.provision, specs))
        refs = sorted(int(s.ref) for s in statuses)
        assert len(set(refs)) == 2 and member.vmid in refs
        assert member.config["tags"] in {f"lebureau;{s.key}" for s in specs}
        claims = [p for m, path, p in sim.requests if m == "PUT" and path.endswith(f"/{member.vmid}/config")]
        assert sum("digest" in p for p in claims) == 2, "both creates tried to claim the member"
    finally:
        sim.stop()
