"""The warm pool: VMs cloned (and, by default, booted) ahead of demand, claimed by creates.

A pool member carries the tags ``lebureau-pool`` and its flavour (``lbp-<profile>-<c>c-<m>m-<d>g``).
A create claims one by renaming and re-tagging it with the config ``digest`` it just read: PVE
refuses the write if anyone changed the config since, so two workers can never claim the same VM.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

from proxmoxer import ResourceException

from workers.drivers.base import DriverError, InstanceSpec, NetworkPolicy

if TYPE_CHECKING:
    from workers.drivers.proxmox import ProxmoxDriver, PveVm

logger = logging.getLogger(__name__)
POOL_TAG = "lebureau-pool"
_LOST_RACE = re.compile(r"detected modified configuration|VM is locked", re.IGNORECASE)


@dataclass(frozen=True)
class PoolShape:
    """One flavour of the pool, i.e. one plan's needs; ``size`` members on every node."""

    profile: str
    vcpus: int
    memory_mib: int
    disk_gib: int
    size: int

    @property
    def tag(self) -> str:
        return f"lbp-{self.profile}-{self.vcpus}c-{self.memory_mib}m-{self.disk_gib}g"

    def fits(self, spec: InstanceSpec) -> bool:
        wanted = (spec.image_profile, spec.vcpus, spec.memory_mib, spec.disk_gib)
        return self.size > 0 and wanted == (self.profile, self.vcpus, self.memory_mib, self.disk_gib)

    @classmethod
    def parse(cls, text: str) -> PoolShape:
        """``profile:vcpus:memory_mib:disk_gib=size``, e.g. ``full:2:4096:20=2``."""
        match = re.fullmatch(r"([a-z0-9_-]+):(\d+):(\d+):(\d+)=(\d+)", text.strip())
        if not match:
            raise ValueError(f"warm pool entry {text!r}: expected profile:vcpus:memory_mib:disk_gib=size")
        profile, *numbers = match.groups()
        return cls(profile, *map(int, numbers))


def members(driver: ProxmoxDriver, shape: PoolShape) -> list[PveVm]:
    return [vm for vm in driver.vms() if POOL_TAG in vm.tags and shape.tag in vm.tags]


def claim(driver: ProxmoxDriver, spec: InstanceSpec, key_tags: tuple[str, ...], name: str) -> PveVm | None:
    """Take a pool member for ``spec``; None when the pool has none to give."""
    shape = next((s for s in driver.warm_pool if s.fits(spec)), None)
    if shape is None:
        return None
    room = driver.node_room()
    crowded = driver.crowded_nodes(spec.workspace)
    # Members on nodes without a desktop of the workspace first (anti-affinity, when on; a member on
    # a crowded node still beats a cold clone), then booted ones (they save the whole boot), then the
    # roomiest node.
    candidates = sorted(
        (vm for vm in members(driver, shape) if not vm.lock),
        key=lambda vm: (vm.node in crowded, vm.status != "running", -room.get(vm.node, (0, 0))[0]),
    )
    for vm in candidates:
        config = driver.call(f"read the config of VM {vm.vmid}", driver.api_vm(vm).config.get)
        if POOL_TAG not in config.get("tags", ""):
            continue
        # A booted member's cloud-init already ran: it only suits a create with the same key.
        if vm.status == "running" and unquote(config.get("sshkeys", "")) != spec.ssh_public_key.strip():
            continue
        try:
            driver.api_vm(vm).config.put(name=name, tags=";".join(key_tags), digest=config["digest"])
        except ResourceException as exc:
            if _LOST_RACE.search(str(exc)):
                continue  # another worker claimed it first
            raise driver.error(f"claim pool VM {vm.vmid}", exc) from exc
        vm.name, vm.tags = name, key_tags
        return vm
    return None


def refill(driver: ProxmoxDriver) -> dict[str, int]:
    """Nodes are refilled side by side (each VM takes a boot's time), one VM at a time on each."""
    nodes = sorted(driver.node_room())
    work = [(shape, node) for shape in driver.warm_pool for node in nodes]
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        counts = list(pool.map(lambda job: _refill_node(driver, *job), work))
    changes = dict.fromkeys((shape.tag for shape in driver.warm_pool), 0)
    for (shape, _), count in zip(work, counts, strict=True):
        changes[shape.tag] += count
    return changes


def _refill_node(driver: ProxmoxDriver, shape: PoolShape, node: str) -> int:
    on_node = [vm for vm in members(driver, shape) if vm.node == node]
    for extra in on_node[shape.size :]:
        driver.destroy_vm(driver.wait_unlocked(extra))
    made = 0
    for _ in range(shape.size - len(on_node)):
        try:
            _make_member(driver, shape, node)
        except DriverError as exc:
            logger.warning("warm pool %s on %s not refilled: %s", shape.tag, node, exc.message)
            break
        made += 1
    return made - max(0, len(on_node) - shape.size)


def _make_member(driver: ProxmoxDriver, shape: PoolShape, node: str) -> None:
    # A stopped member holds no memory; a booted one does, from its start on.
    memory = shape.memory_mib if driver.warm_pool_running else 0
    with driver.placed(memory, shape.vcpus, node=node):
        vm = driver.clone_template(shape.profile, node, f"lbpool-{shape.tag.removeprefix('lbp-')}")
        driver.configure_hardware(vm, shape.vcpus, shape.memory_mib, shape.disk_gib, (POOL_TAG, shape.tag))
        driver.configure_cloud_init(vm, driver.pool_ssh_public_key)
        driver.apply_firewall(vm, NetworkPolicy())
        if driver.warm_pool_running:
            driver.boot(vm)
