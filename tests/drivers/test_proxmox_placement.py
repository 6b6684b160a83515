"""Per-workspace anti-affinity of the Proxmox driver's placement, on a three-node simulator."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from desktops.lifecycle import instance_spec
from tests.factories import DesktopFactory
from tests.pve.simulator import TaskTimes
from tests.pve.support import driver_for, make_spec, needs_schema, simulator
from workers.drivers.base import DriverError
from workers.drivers.proxmox import PoolShape
from workers.drivers.proxmox.api import vm_name

pytestmark = needs_schema


@pytest.fixture
def sim():
    # pve1 is much roomier: by free memory alone, every desktop below would land on it.
    sim = simulator({"pve1": (65536, 16), "pve2": (16384, 16), "pve3": (16384, 16)}, TaskTimes(clone=0.05))
    yield sim
    sim.stop()


def node_of(sim, status) -> str:
    return sim.vms[int(status.ref)].node


def test_without_anti_affinity_a_workspace_piles_onto_the_roomiest_node(sim):
    pve = driver_for(sim)
    assert {node_of(sim, pve.provision(make_spec(workspace="ws_a"))) for _ in range(2)} == {"pve1"}


def test_desktops_of_one_workspace_land_on_different_nodes(sim):
    pve = driver_for(sim, anti_affinity=True)
    first, second = (make_spec(workspace="ws_a") for _ in range(2))
    nodes = [node_of(sim, pve.provision(first)), node_of(sim, pve.provision(second))]
    assert nodes[0] == "pve1" and nodes[1] != "pve1"
    # The workspace is in the VM's tags, which is what placement reads back from /cluster/resources.
    assert sim.vm_by_name(vm_name(first.key)).config["tags"] == f"lebureau;{first.key};lbws-ws_a"
    assert sorted(i.key for i in pve.list_instances()) == sorted([first.key, second.key])
    # Another workspace is not pushed away by ws_a's desktops.
    assert node_of(sim, pve.provision(make_spec(workspace="ws_b"))) == "pve1"


def test_when_every_node_holds_the_workspace_the_next_desktop_is_still_placed(sim):
    pve = driver_for(sim, anti_affinity=True)
    nodes = [node_of(sim, pve.provision(make_spec(workspace="ws_a"))) for _ in range(4)]
    assert sorted(nodes[:3]) == ["pve1", "pve2", "pve3"]
    assert nodes[3] == "pve1"


@pytest.mark.django_db
def test_desktops_built_by_the_lifecycle_carry_their_workspace(sim):
    pve = driver_for(sim, anti_affinity=True)
    first = DesktopFactory()
    second = DesktopFactory(workspace=first.workspace)
    assert instance_spec(first)[0].workspace == first.workspace_id
    nodes = [node_of(sim, pve.provision(instance_spec(desktop)[0])) for desktop in (first, second)]
    assert nodes[0] != nodes[1]


def test_concurrent_creates_of_one_workspace_spread(sim):
    pve = driver_for(sim, anti_affinity=True)
    with ThreadPoolExecutor(3) as pool:
        statuses = list(pool.map(pve.provision, [make_spec(workspace="ws_a") for _ in range(3)]))
    assert sorted(node_of(sim, s) for s in statuses) == ["pve1", "pve2", "pve3"]


def test_a_workspace_desktop_prefers_a_pool_member_on_a_node_without_the_workspace(sim):
    shape = PoolShape("minimal", 1, 1024, 10, size=1)
    pve = driver_for(sim, anti_affinity=True, warm_pool=(shape,))
    pve.refill_pool()
    nodes = [node_of(sim, pve.provision(make_spec(workspace="ws_a"))) for _ in range(3)]
    assert sorted(nodes) == ["pve1", "pve2", "pve3"]
    assert not [vm for vm in sim.vms.values() if "lebureau-pool" in vm.config.get("tags", "")]


def test_a_malformed_workspace_is_refused_before_anything_is_made(sim):
    pve = driver_for(sim)
    with pytest.raises(DriverError, match="not a valid workspace id"):
        pve.provision(make_spec(workspace="WS A"))
    assert len(sim.vms) == 1  # the template alone
