"""The warm pool: VMs cloned (and, by default, booted) ahead of demand, claimed by creates.

A pool member carries the tags ``lebureau-pool`` and its flavour (``lbp-<profile>-<c>c-<m>m-<d>g``).
A create claims one by renaming and re-tagging it with the config ``digest`` it just read: PVE
refuses the write if anyone changed the config since, so two workers can never claim the same VM.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

from proxmoxer import ResourceException

from workers.drivers.base import DriverError, InstanceSpec, NetworkPolicy, PoolShape
from workers.drivers.proxmox.api import PveVm
from workers.drivers.proxmox.machines import Machines

logger = logging.getLogger(__name__)
POOL_TAG = "lebureau-pool"
_LOST_RACE = re.compile(r"detected modified configuration|VM is locked", re.IGNORECASE)


def members(machines: Machines, shape: PoolShape) -> list[PveVm]:
    return [vm for vm in machines.pve.vms() if POOL_TAG in vm.tags and shape.tag in vm.tags]


def claim(machines: Machines, spec: InstanceSpec, key_tags: tuple[str, ...], name: str) -> PveVm | None:
    """Take a pool member for ``spec``; None when the pool has none to give."""
    shape = next((s for s in machines.config.warm_pool if s.fits(spec)), None)
    if shape is None:
        return None
    pve, placement = machines.pve, machines.placement
    room = placement.node_room()
    crowded = placement.crowded_nodes(spec.workspace)
    # Members on nodes without a desktop of the workspace first (anti-affinity, when on; a member on
    # a crowded node still beats a cold clone), then booted ones (they save the whole boot), then the
    # roomiest node.
    candidates = sorted(
        (vm for vm in members(machines, shape) if not vm.lock),
        key=lambda vm: (vm.node in crowded, vm.status != "running", -room.get(vm.node, (0, 0))[0]),
    )
    for vm in candidates:
        config = pve.call(f"read the config of VM {vm.vmid}", pve.vm(vm).config.get)
        if POOL_TAG not in config.get("tags", ""):
            continue
        # A booted member's cloud-init already ran: it only suits a create with the same key.
        if vm.status == "running" and unquote(config.get("sshkeys", "")) != spec.ssh_public_key.strip():
            continue
        try:
            pve.vm(vm).config.put(name=name, tags=";".join(key_tags), digest=config["digest"])
        except ResourceException as exc:
            if _LOST_RACE.search(str(exc)):
                continue  # another worker claimed it first
            raise pve.error(f"claim pool VM {vm.vmid}", exc) from exc
        vm.name, vm.tags = name, key_tags
        return vm
    return None


def refill(machines: Machines) -> dict[str, int]:
    """Nodes are refilled side by side (each VM takes a boot's time), one VM at a time on each."""
    shapes = machines.config.warm_pool
    nodes = sorted(machines.placement.node_room())
    work = [(shape, node) for shape in shapes for node in nodes]
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        counts = list(pool.map(lambda job: _refill_node(machines, *job), work))
    changes = dict.fromkeys((shape.tag for shape in shapes), 0)
    for (shape, _), count in zip(work, counts, strict=True):
        changes[shape.tag] += count
    return changes


def _refill_node(machines: Machines, shape: PoolShape, node: str) -> int:
    on_node = [vm for vm in members(machines, shape) if vm.node == node]
    for extra in on_node[shape.size :]:
        machines.destroy_vm(machines.pve.wait_unlocked(extra))
    made = 0
    for _ in range(shape.size - len(on_node)):
        try:
            _make_member(machines, shape, node)
        except DriverError as exc:
            logger.warning("warm pool %s on %s not refilled: %s", shape.tag, node, exc.message)
            break
        made += 1
    return made - max(0, len(on_node) - shape.size)


def _make_member(machines: Machines, shape: PoolShape, node: str) -> None:
    running = machines.config.warm_pool_running
    # A stopped member holds no memory; a booted one does, from its start on.
    with machines.placement.placed(shape.memory_mib if running else 0, shape.vcpus, node=node):
        vm = machines.clone_template(shape.profile, node, f"lbpool-{shape.tag.removeprefix('lbp-')}")
        machines.configure_hardware(vm, shape.vcpus, shape.memory_mib, shape.disk_gib, (POOL_TAG, shape.tag))
        machines.configure_cloud_init(vm, machines.ssh_public_key)
        machines.apply_firewall(vm, NetworkPolicy())
        if running:
            machines.boot(vm)
