"""The Proxmox VE compute driver: each desktop is a QEMU/KVM VM, a linked clone of a template.

The driver keeps no local state: a desktop's VM is found by its tag (the desktop key) or its name
(``dsk-…``, set atomically by the clone itself), so any worker on any host can act on any desktop.
The API and its errors are in ``api``, placement in ``placement``, making and powering VMs in
``machines``, the warm pool in ``pool``, the firewall in ``firewall``.

Writing ``spec.files`` and the hostname into the guest is not a PVE operation: it is done after boot
by ``guest_setup`` (default: SSH with the control plane's key, see ``guest``). Tests and the bench
inject a recorder instead, because the simulator has no guest to log into.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import quote

from workers.drivers.base import (
    NOT_RESUMABLE,
    NOT_SUSPENDABLE,
    BlockedEgress,
    ComputeDriver,
    ConsoleTicket,
    ControlPlane,
    DriverError,
    InstanceSpec,
    InstanceState,
    InstanceStatus,
    NetworkPolicy,
    Progress,
    ProvisionStep,
    check_spec,
    no_progress,
)
from workers.drivers.proxmox import blocked, pool
from workers.drivers.proxmox.api import PveApi, PveVm, checked_key, desktop_tags, key_of, vm_name
from workers.drivers.proxmox.config import ProxmoxConfig
from workers.drivers.proxmox.firewall import (
    DOMAINS,
    Resolver,
    converge_ipset,
    domains_of,
    kept_entries,
    resolve_ipv4,
    resolved,
)
from workers.drivers.proxmox.guest import SshGuestSetup
from workers.drivers.proxmox.machines import Machines

logger = logging.getLogger(__name__)

GuestSetup = Callable[[InstanceSpec, str], None]


class ProxmoxDriver(ComputeDriver):
    name = "proxmox"

    def __init__(
        self,
        config: ProxmoxConfig,
        control_plane: ControlPlane,
        *,
        guest_setup: GuestSetup | None = None,
        resolve: Resolver = resolve_ipv4,
    ):
        self.config = config
        self.pve = PveApi(config)
        self.machines = Machines(
            self.pve,
            config,
            ssh_user=control_plane.ssh_user,
            ssh_public_key=control_plane.ssh_public_key,
            resolve=resolve,
        )
        self.guest_setup = guest_setup or SshGuestSetup(control_plane)
        self.resolve = resolve
        self._domains_refreshed_at = float("-inf")

    @classmethod
    def from_env(cls, control_plane: ControlPlane) -> ProxmoxDriver:
        return cls(ProxmoxConfig.from_env(), control_plane)

    @property
    def api(self):
        """The raw PVE API client."""
        return self.pve.api

    # -- the interface ------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return f"proxmox:{self.config.host}"

    def provision(self, spec: InstanceSpec, progress: Progress = no_progress) -> InstanceStatus:
        key = checked_key(spec.key)
        check_spec(spec, min_memory_mib=256)
        tags, name = desktop_tags(key, spec.workspace), vm_name(key)
        progress(ProvisionStep.CLONE)
        vm = self.pve.find(key) or pool.claim(self.machines, spec, tags, name)
        if vm is None:
            # The room stays held until the VM runs and counts in the node's own figures.
            placed = self.machines.placement.placed(spec.memory_mib, spec.vcpus, workspace=spec.workspace)
            with placed as node:
                vm = self.machines.clone_template(spec.image_profile, node, name)
                progress(ProvisionStep.NETWORK)
                ip = self.machines.personalise(self.pve.wait_unlocked(vm), spec, tags)
        else:
            progress(ProvisionStep.NETWORK)
            ip = self.machines.personalise(self.pve.wait_unlocked(vm), spec, tags)
        progress(ProvisionStep.KEYS)
        self.guest_setup(spec, ip)
        progress(ProvisionStep.READY)
        return InstanceStatus(key=key, state=InstanceState.RUNNING, private_ip=ip, ref=str(vm.vmid))

    def start(self, key: str) -> InstanceStatus:
        vm = self.pve.existing(key, "start")
        self.machines.boot(vm)
        return self.machines.status_of(vm, key)

    def stop(self, key: str) -> InstanceStatus:
        vm = self.pve.existing(key, "stop")
        if vm.status == "running":
            self.machines.power_off(vm)
        return self.machines.status_of(vm, key)

    def suspend(self, key: str) -> InstanceStatus:
        vm = self.pve.existing(key, "suspend")
        if vm.status == "stopped":
            raise DriverError(
                f"desktop {key} is stopped: there is nothing in memory to suspend", reason=NOT_SUSPENDABLE
            )
        if not self.pve.paused(vm):
            self.pve.task(vm, "suspend", self.pve.vm(vm).status.suspend.post)
        return self.machines.status_of(vm, key)

    def resume(self, key: str) -> InstanceStatus:
        vm = self.pve.existing(key, "resume")
        if vm.status == "stopped":
            raise DriverError(
                f"desktop {key} is stopped, not suspended: start it instead", reason=NOT_RESUMABLE
            )
        if self.pve.paused(vm):
            self.pve.task(vm, "resume", self.pve.vm(vm).status.resume.post)
        return self.machines.status_of(vm, key)

    def destroy(self, key: str) -> None:
        vm = self.pve.find(checked_key(key))
        if vm is not None:
            self.machines.destroy_vm(self.pve.wait_unlocked(vm))

    def status(self, key: str) -> InstanceStatus:
        vm = self.pve.find(checked_key(key))
        if vm is None:
            return InstanceStatus(key=key, state=InstanceState.ABSENT)
        return self.machines.status_of(vm, key)

    def disk_usage(self, key: str) -> int | None:
        vm = self.pve.find(checked_key(key))
        return None if vm is None else self.machines.disk_bytes(vm)

    def list_instances(self) -> list[InstanceStatus]:
        """Every desktop VM, without addresses: asking each guest agent would make reconciling slow."""
        instances = []
        for vm in self.pve.vms():
            key = key_of(vm)
            if key:
                state = InstanceState.STOPPED
                if vm.status == "running":
                    state = InstanceState.SUSPENDED if self.pve.paused(vm) else InstanceState.RUNNING
                instances.append(InstanceStatus(key=key, state=state, ref=str(vm.vmid)))
        return instances

    def apply_network_policy(self, key: str, policy: NetworkPolicy) -> None:
        vm = self.pve.existing(key, "change the network policy of")
        self.machines.ensure_nameserver(vm)
        self.machines.apply_firewall(vm, policy)

    def blocked_egress(self, key: str) -> BlockedEgress | None:
        """The names the desktops' resolver refused the VM (kept on its firewall) and the packets its
        firewall dropped on their way out (PVE's firewall log), per address: see ``blocked``."""
        vm = self.pve.find(checked_key(key))
        if vm is None:
            return None
        firewall = self.pve.vm(vm).firewall
        sets = self.pve.call(f"list the IP sets of VM {vm.vmid}", firewall.ipset.get)
        comment = next((s.get("comment", "") for s in sets if s["name"] == blocked.REFUSED), "")
        # A VM whose firewall predates the record: every line of its VMID is taken as its own.
        since, names = blocked.refused_record(comment) or (0, [])
        lines = self._firewall_log(vm, firewall)
        return BlockedEgress(
            names=tuple((n.name, n.count) for n in names),
            addresses=tuple(blocked.dropped(lines, vm.vmid, since, time.time())),
        )

    def _firewall_log(self, vm: PveVm, firewall) -> list[str]:
        """The VM's lines of its node's current firewall log, page by page (PVE's default is 50 lines)."""
        lines: list[str] = []
        for page in range(blocked.LOG_PAGES):
            got = self.pve.call(
                f"read the firewall log of VM {vm.vmid}",
                firewall.log.get,
                start=page * blocked.LOG_PAGE,
                limit=blocked.LOG_PAGE,
            )
            lines += [line["t"] for line in got]
            if len(got) < blocked.LOG_PAGE:
                break
        return lines

    def console(self, key: str) -> ConsoleTicket:
        """The VM's emulated display through PVE: ``vncproxy`` opens it, ``vncwebsocket`` carries it.

        PVE puts VNC authentication in front of it. Its password is the ticket unless one is generated;
        a generated one is asked for, because VNC authentication only uses a password's first eight
        characters and a ticket's are always "PVEVNC:" and a hex digit.
        """
        vm = self.pve.existing(key, "open the console of")
        if vm.status != "running":
            raise DriverError(f"desktop {key} is not running: it has no console")
        proxy = self.pve.call(
            "open the console", self.pve.vm(vm).vncproxy.post, websocket=1, **{"generate-password": 1}
        )
        connection = self.pve.connection
        user, token_name, secret = (connection[k] for k in ("user", "token_name", "token_value"))
        path = f"/api2/json/nodes/{vm.node}/qemu/{vm.vmid}/vncwebsocket"
        query = f"port={proxy['port']}&vncticket={quote(proxy['ticket'], safe='')}"
        return ConsoleTicket(
            url=f"wss://{connection['host']}{path}?{query}",
            password=proxy["password"],
            headers={"Authorization": f"PVEAPIToken={user}!{token_name}={secret}"},
            verify=connection["verify_ssl"],
        )

    # -- periodic work ------------------------------------------------------------------------

    def maintenance(self) -> dict:
        """Refill the warm pool; re-resolve the allowed domains when their interval has passed."""
        done: dict = {}
        if self.config.warm_pool:
            done["warm_pool"] = self.refill_pool()
        if time.monotonic() - self._domains_refreshed_at >= self.config.domain_refresh_interval:
            done["allowed_domains"] = self.refresh_allowed_domains()
            self._domains_refreshed_at = time.monotonic()
        return done

    def refresh_allowed_domains(self) -> dict[str, tuple[str, ...]]:
        """Re-resolve the allowed domains of every desktop VM and bring its IP set up to date: the
        addresses resolved now, and those the desktops' resolver answered whose time is not up.

        Returns the new addresses of each desktop whose set changed. A desktop whose lookup or update
        fails keeps its set as it was and is tried again next time.
        """
        changed, lookups = {}, {}

        def resolve(domain: str) -> tuple[str, ...]:
            # Desktops share domains: one lookup per domain and refresh.
            if domain not in lookups:
                lookups[domain] = tuple(self.resolve(domain))
            return lookups[domain]

        for vm in self.pve.vms():
            key = key_of(vm)
            if not key:
                continue
            firewall = self.pve.vm(vm).firewall
            try:
                sets = self.pve.call(f"list the IP sets of VM {vm.vmid}", firewall.ipset.get)
                domains = next((domains_of(s.get("comment", "")) for s in sets if s["name"] == DOMAINS), ())
                if not domains:
                    continue
                ipset = firewall.ipset(DOMAINS)
                entries = self.pve.call(f"read the domains of VM {vm.vmid}", ipset.get)
                addresses = kept_entries(entries, resolved(domains, resolve))
                if self.pve.call(
                    f"refresh the domains of VM {vm.vmid}", converge_ipset, ipset, addresses, entries
                ):
                    changed[key] = addresses
            except DriverError as exc:
                logger.warning("allowed domains of %s not refreshed: %s", key, exc.message)
        return changed

    def refill_pool(self) -> dict[str, int]:
        """Bring every pool flavour to its size on every node: clone what is missing, remove extras.

        Returns how many VMs were made (+) or removed (-) per flavour.
        """
        return pool.refill(self.machines)
