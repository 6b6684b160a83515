"""Which node a new VM goes to: the one with the most free memory that fits, and while anti-affinity is
on, preferably one holding no other desktop of the same workspace."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

from workers.drivers.base import NO_CAPACITY, DriverError
from workers.drivers.proxmox.api import PveApi, workspace_tag
from workers.drivers.proxmox.config import ProxmoxConfig

MIB = 1024 * 1024


class Placement:
    def __init__(self, pve: PveApi, config: ProxmoxConfig):
        self.pve, self.config = pve, config
        # Memory and cores promised to clones this process is still making, so concurrent creates
        # spread instead of all picking the same emptiest node.
        self._pending: dict[str, tuple[int, int]] = {}
        # (workspace, node) of those clones, so concurrent creates of one workspace spread too.
        self._pending_workspaces: Counter[tuple[str, str]] = Counter()
        self._lock = threading.RLock()

    def node_room(self) -> dict[str, tuple[int, float]]:
        """Free memory (MiB, after the reserve) and free vCPUs (after overcommit) of each online node."""
        resources = self.pve.call("read the cluster's resources", self.pve.api.cluster.resources.get)
        room = {}
        vms = [r for r in resources if r.get("type") == "qemu" and r.get("status") == "running"]
        with self._lock:
            pending = dict(self._pending)
        for node in resources:
            if node.get("type") != "node" or node.get("status") != "online":
                continue
            name = node["node"]
            committed = sum(int(r.get("maxmem", 0)) for r in vms if r["node"] == name) // MIB
            cores = sum(int(r.get("maxcpu", 0)) for r in vms if r["node"] == name)
            extra_mem, extra_cores = pending.get(name, (0, 0))
            used = max(int(node.get("mem", 0)) // MIB, committed) + extra_mem
            free_mem = int(node["maxmem"]) // MIB - self.config.memory_reserve_mib - used
            free_cpu = int(node["maxcpu"]) * self.config.cpu_overcommit - cores - extra_cores
            room[name] = (free_mem, free_cpu)
        return room

    def crowded_nodes(self, workspace: str) -> set[str]:
        """The nodes placement avoids for a new desktop of ``workspace``: those already holding one.

        Empty unless anti-affinity is on. A VM counts whatever its state: a stopped one starts there.
        """
        if not (self.config.anti_affinity and workspace):
            return set()
        tag = workspace_tag(workspace)
        with self._lock:
            pending = {n for w, n in self._pending_workspaces if w == workspace}
            return pending | {vm.node for vm in self.pve.vms() if tag in vm.tags}

    @contextlib.contextmanager
    def placed(self, memory_mib: int, vcpus: int, node: str | None = None, workspace: str = ""):
        """Pick the node with the most free memory that fits, and hold the room until the VM runs."""
        with self._lock:
            room = self.node_room()
            fitting = {n: r for n, r in room.items() if r[0] >= memory_mib and r[1] >= vcpus}
            if node is not None:
                fitting = {n: r for n, r in fitting.items() if n == node}
            crowded = self.crowded_nodes(workspace)
            # Anti-affinity is a preference, not a rule: when every node that fits already holds a
            # desktop of the workspace, one of them still gets the new one rather than nobody.
            fitting = {n: r for n, r in fitting.items() if n not in crowded} or fitting
            if not fitting:
                best = ", ".join(f"{n}: {m} MiB and {c:g} vCPUs free" for n, (m, c) in sorted(room.items()))
                raise DriverError(
                    f"no capacity: no Proxmox node has {memory_mib} MiB and {vcpus} vCPUs free after the "
                    f"{self.config.memory_reserve_mib} MiB reserve ({best or 'no node online'})",
                    reason=NO_CAPACITY,
                )
            chosen = max(fitting, key=lambda n: fitting[n])
            mem, cores = self._pending.get(chosen, (0, 0))
            self._pending[chosen] = (mem + memory_mib, cores + vcpus)
            self._pending_workspaces[(workspace, chosen)] += 1
        try:
            yield chosen
        finally:
            with self._lock:
                mem, cores = self._pending[chosen]
                self._pending[chosen] = (mem - memory_mib, cores - vcpus)
                # In-place subtraction drops the counts that reach zero.
                self._pending_workspaces -= Counter({(workspace, chosen): 1})
