"""Making and powering desktop VMs: clone a template, size it, give it cloud-init and its firewall,
boot it and learn its address."""

from __future__ import annotations

import contextlib
import random
import re
import time
from urllib.parse import quote

from proxmoxer import ResourceException

from workers.drivers.base import (
    IMAGE_MISSING,
    DriverError,
    InstanceSpec,
    InstanceState,
    InstanceStatus,
    NetworkPolicy,
    TransientDriverError,
)
from workers.drivers.proxmox.api import PveApi, PveVm, pve_message
from workers.drivers.proxmox.config import ProxmoxConfig
from workers.drivers.proxmox.firewall import Resolver, apply_firewall, firewall_plan
from workers.drivers.proxmox.placement import Placement

_ALREADY_EXISTS = re.compile(r"already exists", re.IGNORECASE)
_ALREADY_RUNNING = re.compile(r"already running", re.IGNORECASE)
_AGENT_NOT_READY = re.compile(r"guest agent is not running|not running", re.IGNORECASE)
_DISK_SIZE = re.compile(r"size=(\d+(?:\.\d+)?)([KMGT]?)")
_UNITS = {"": 1 / 1024**3, "K": 1 / 1024**2, "M": 1 / 1024, "G": 1, "T": 1024}


class Machines:
    def __init__(
        self, pve: PveApi, config: ProxmoxConfig, *, ssh_user: str, ssh_public_key: str, resolve: Resolver
    ):
        self.pve, self.config = pve, config
        self.ssh_user, self.ssh_public_key, self.resolve = ssh_user, ssh_public_key, resolve
        self.placement = Placement(pve, config)

    def clone_template(self, profile: str, node: str, name: str) -> PveVm:
        """Clone the profile's template onto ``node`` under a fresh VMID, retrying when one is taken."""
        template = self._template(profile)
        params = {"name": name, "full": int(self.config.full_clone)}
        if node != template.node:
            params["target"] = node
        if self.config.full_clone and self.config.clone_storage:
            params["storage"] = self.config.clone_storage
        source = self.pve.vm(template)
        for attempt in range(self.config.nextid_attempts):
            vmid = int(self.pve.call("pick a VMID", self.pve.api.cluster.nextid.get))
            try:
                upid = source.clone.post(newid=vmid, **params)
            except ResourceException as exc:
                # nextid is not a reservation: another worker may have taken it since. Creates that
                # collided would ask again in step and collide again (of twenty at once, one ran out
                # of tries): each waits a random while first.
                if _ALREADY_EXISTS.search(pve_message(exc)):
                    time.sleep(random.uniform(0, 0.05 * (attempt + 1)))  # noqa: S311 (not a secret)
                    continue
                raise self.pve.error(f"clone template {template.vmid}", exc) from exc
            vm = PveVm(vmid, node, name, "stopped", (), "clone")
            self.pve.wait_task(upid, f"clone template {template.vmid} into VM {vmid}")
            vm.lock = ""
            return vm
        raise TransientDriverError(
            f"every VMID Proxmox offered was taken first ({self.config.nextid_attempts} tries)"
        )

    def _template(self, profile: str) -> PveVm:
        vmid = self.config.templates.get(profile)
        if vmid is None:
            known = ", ".join(sorted(self.config.templates)) or "none"
            raise DriverError(
                f"no Proxmox template for the image profile {profile!r} (configured: {known})",
                reason=IMAGE_MISSING,
            )
        resources = self.pve.call("list VMs", self.pve.api.cluster.resources.get, type="vm")
        found = next((r for r in resources if int(r.get("vmid", 0)) == vmid), None)
        if found is None or not found.get("template"):
            raise DriverError(
                f"the template VM {vmid} of profile {profile!r} is missing or not a template",
                reason=IMAGE_MISSING,
            )
        return PveVm(vmid, found["node"], found.get("name", ""), "stopped", (), "")

    def configure_hardware(
        self, vm: PveVm, vcpus: int, memory_mib: int, disk_gib: int, tags: tuple[str, ...]
    ) -> None:
        """Caps, NIC with the firewall on, guest agent, tags; the disk only ever grows."""
        self.pve.call(
            f"configure VM {vm.vmid}",
            self.pve.vm(vm).config.put,
            cores=vcpus,
            memory=str(memory_mib),
            agent="1",
            net0=f"virtio,bridge={self.config.bridge},firewall=1",
            tags=";".join(tags),
        )
        config = self.pve.call(f"read the config of VM {vm.vmid}", self.pve.vm(vm).config.get)
        if _disk_gib(config.get(self.config.disk, "")) < disk_gib:
            self.pve.task(
                vm,
                "resize the disk of",
                self.pve.vm(vm).resize.put,
                disk=self.config.disk,
                size=f"{disk_gib}G",
            )
        vm.tags = tags

    def configure_cloud_init(self, vm: PveVm, ssh_public_key: str, digest: str | None = None) -> None:
        """The control plane's key, and the address the control plane gives the VM (no DHCP)."""
        network = self.config.network
        address = f"{self.config.address_of(vm.vmid)}/{network.prefixlen}"
        # With the desktops' resolver, the VM's only one: its firewall lets DNS go nowhere else.
        dns = {"nameserver": self.config.resolver_address} if self.config.resolver_address else {}
        self.pve.call(
            f"set cloud-init on VM {vm.vmid}",
            self.pve.vm(vm).config.put,
            ciuser=self.ssh_user,
            # PVE wants the keys URL-encoded with spaces as %20, never '+'.
            sshkeys=quote(ssh_public_key.strip(), safe=""),
            ipconfig0=f"ip={address},gw={self.config.gateway_address}",
            digest=digest,
            **dns,
        )

    def ensure_nameserver(self, vm: PveVm) -> None:
        """The resolver as the VM's cloud-init nameserver, for VMs made before it was configured: their
        firewall sends DNS nowhere else, and cloud-init applies it at their next boot."""
        wanted = self.config.resolver_address
        if not wanted:
            return
        config = self.pve.call(f"read the config of VM {vm.vmid}", self.pve.vm(vm).config.get)
        if config.get("nameserver") != wanted:
            self.pve.call(
                f"set the nameserver of VM {vm.vmid}",
                self.pve.vm(vm).config.put,
                nameserver=wanted,
                digest=config.get("digest"),
            )

    def apply_firewall(self, vm: PveVm, policy: NetworkPolicy) -> None:
        """VM firewall on, inbound only from the control plane, outbound per policy, never to desktops."""
        config = self.config
        plan = firewall_plan(
            policy,
            config.address_of(vm.vmid),
            config.control_cidrs,
            config.control_tcp_ports,
            config.private_cidrs,
            self.resolve,
            config.resolver_address,
        )
        self.pve.call(f"set the firewall of VM {vm.vmid}", apply_firewall, self.pve.vm(vm), plan)

    def personalise(self, vm: PveVm, spec: InstanceSpec, tags: tuple[str, ...]) -> str:
        """A stopped VM gets the plan, cloud-init and the firewall, then boots; returns its address."""
        if vm.status == "stopped":
            self.configure_hardware(vm, spec.vcpus, spec.memory_mib, spec.disk_gib, tags)
            self.configure_cloud_init(vm, spec.ssh_public_key)
            self.apply_firewall(vm, NetworkPolicy())
        return self.boot(vm)

    def boot(self, vm: PveVm) -> str:
        """Start or resume the VM as needed, wait until its network is up, and return its address.

        The address is the one the control plane gave it, never what the guest says: the guest agent
        is only asked whether the network came up with it.
        """
        if vm.status == "stopped":
            self.start(vm)
        elif self.pve.paused(vm):
            self.pve.task(vm, "resume", self.pve.vm(vm).status.resume.post)
        address = self.config.address_of(vm.vmid)
        self._wait_for_address(vm, address)
        return address

    def start(self, vm: PveVm) -> None:
        """Start the VM. PVE checks whether it already runs inside the start task; when it does, an
        earlier start whose answer was lost, or another worker's, got there first: that is a start."""
        upid = self.pve.call(f"start VM {vm.vmid}", self.pve.vm(vm).status.start.post)
        exit_status = self.pve.wait_task(upid, f"start VM {vm.vmid}", accept=_ALREADY_RUNNING)
        vm.status = self.pve.refresh(vm)["status"] if _ALREADY_RUNNING.search(exit_status) else "running"

    def power_off(self, vm: PveVm) -> None:
        """A clean shutdown first; a guest that ignores it (or is paused) is stopped hard."""
        if not self.pve.paused(vm):
            timeout = self.config.shutdown_timeout
            upid = self.pve.call(
                f"shut down VM {vm.vmid}", self.pve.vm(vm).status.shutdown.post, timeout=timeout
            )
            with contextlib.suppress(DriverError):
                self.pve.wait_task(upid, f"shut down VM {vm.vmid}", timeout=timeout + 30)
                return
        self.pve.task(vm, "stop", self.pve.vm(vm).status.stop.post)

    def destroy_vm(self, vm: PveVm) -> None:
        if vm.status == "running":
            self.pve.task(vm, "stop", self.pve.vm(vm).status.stop.post)
        self.pve.task(vm, "destroy", self.pve.vm(vm).delete, purge=1, **{"destroy-unreferenced-disks": 1})

    def disk_bytes(self, vm: PveVm) -> int:
        """The size of the VM's disk as its configuration states it (the storage it holds on the node)."""
        config = self.pve.call(f"read the config of VM {vm.vmid}", self.pve.vm(vm).config.get)
        return round(_disk_gib(config.get(self.config.disk, "")) * 1024**3)

    def status_of(self, vm: PveVm, key: str) -> InstanceStatus:
        current = self.pve.refresh(vm)
        if current["status"] == "stopped":
            return InstanceStatus(key=key, state=InstanceState.STOPPED, ref=str(vm.vmid))
        if current.get("qmpstatus") in ("paused", "suspended"):
            return InstanceStatus(key=key, state=InstanceState.SUSPENDED, ref=str(vm.vmid))
        address = self.config.address_of(vm.vmid)
        return InstanceStatus(key=key, state=InstanceState.RUNNING, private_ip=address, ref=str(vm.vmid))

    def _reports(self, vm: PveVm, address: str) -> bool:
        """Whether the guest agent answers and has the VM's address up; False while it is not running."""
        try:
            answer = self.pve.vm(vm).agent("network-get-interfaces").get()
        except ResourceException as exc:
            if _AGENT_NOT_READY.search(pve_message(exc)):
                return False
            raise
        return any(
            reported.get("ip-address") == address
            for interface in answer.get("result", [])
            for reported in interface.get("ip-addresses", [])
        )

    def _wait_for_address(self, vm: PveVm, address: str) -> None:
        deadline = time.monotonic() + self.config.agent_timeout
        while not self.pve.call(f"ask the guest agent of VM {vm.vmid}", self._reports, vm, address):
            if time.monotonic() > deadline:
                raise TransientDriverError(
                    f"VM {vm.vmid} started but its network did not come up with {address} "
                    f"within {self.config.agent_timeout:.0f} s"
                )
            time.sleep(self.config.poll_interval)


def _disk_gib(disk: str) -> float:
    match = _DISK_SIZE.search(disk)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else 0.0
