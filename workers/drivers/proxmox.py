"""The Proxmox VE compute driver: each desktop is a QEMU/KVM VM, a linked clone of a template.

The driver keeps no local state: a desktop's VM is found by its tag (the desktop key) or its name
(``dsk-…``, set atomically by the clone itself), so any worker on any host can act on any desktop.
Every PVE task is followed to its end through its UPID, on the node the UPID names, and only
``OK`` or ``WARNINGS: n`` count as success.

Errors: PVE answers most refusals with HTTP 500 and its message in the reason phrase. Locks, lock
timeouts, quorum loss, proxy errors (>= 502) and network failures are transient; every other
refusal is permanent and carries PVE's own words, since retrying "does not exist" only delays it.

Writing ``spec.files`` and the hostname into the guest is not a PVE operation: it is done after boot
by ``guest_setup`` (default: SSH with the control plane's key, see ``proxmox_guest``). Tests and the
bench inject a recorder instead, because the simulator has no guest to log into.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import requests
from proxmoxer import ProxmoxAPI, ResourceException

from workers.drivers import proxmox_pool
from workers.drivers.base import (
    ComputeDriver,
    ConsoleTicket,
    DriverError,
    InstanceSpec,
    InstanceState,
    InstanceStatus,
    NetworkPolicy,
    Progress,
    ProvisionStep,
    TransientDriverError,
    check_spec,
    guest_hostname,
    no_progress,
)
from workers.drivers.proxmox_firewall import (
    DOMAINS,
    Resolver,
    apply_firewall,
    converge_ipset,
    domains_of,
    firewall_plan,
    resolve_ipv4,
    resolved,
)
from workers.drivers.proxmox_guest import ssh_guest_setup
from workers.drivers.proxmox_pool import PoolShape

logger = logging.getLogger(__name__)
MIB = 1024 * 1024
OWNER_TAG = "lebureau"
# The tag naming a desktop's workspace is this prefix and the workspace's id.
WORKSPACE_TAG = "lbws-"
_KEY = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# PVE refusals worth retrying: someone else holds the VM, or the cluster is briefly unwell.
_TRANSIENT = re.compile(
    r"VM is locked|can't lock file|got timeout|timeout|no quorum|cluster not ready|"
    r"detected modified configuration|temporarily unavailable",
    re.IGNORECASE,
)
_ALREADY_EXISTS = re.compile(r"already exists", re.IGNORECASE)
_AGENT_NOT_READY = re.compile(r"guest agent is not running|not running", re.IGNORECASE)
_DISK_SIZE = re.compile(r"size=(\d+(?:\.\d+)?)([KMGT]?)")
_UNITS = {"": 1 / 1024**3, "K": 1 / 1024**2, "M": 1 / 1024, "G": 1, "T": 1024}
DEFAULT_PRIVATE_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")

GuestSetup = Callable[[InstanceSpec, str], None]


@dataclass
class PveVm:
    """A VM as /cluster/resources lists it, refreshed in place as the driver acts on it."""

    vmid: int
    node: str
    name: str
    status: str
    tags: tuple[str, ...]
    lock: str


class ProxmoxDriver(ComputeDriver):
    name = "proxmox"

    def __init__(
        self,
        *,
        host: str,
        token_user: str,
        token_name: str,
        token_secret: str,
        templates: dict[str, int],
        verify_ssl: bool | str = True,
        bridge: str = "vmbr0",
        disk: str = "scsi0",
        full_clone: bool = False,
        clone_storage: str = "",
        ciuser: str = "agent",
        ipconfig: str = "ip=dhcp",
        memory_reserve_mib: int = 2048,
        cpu_overcommit: float = 4.0,
        anti_affinity: bool = False,
        control_cidrs: tuple[str, ...] = (),
        control_tcp_ports: tuple[int, ...] = (8000,),
        private_cidrs: tuple[str, ...] = DEFAULT_PRIVATE_CIDRS,
        warm_pool: tuple[PoolShape, ...] = (),
        warm_pool_running: bool = True,
        pool_ssh_public_key: str = "",
        guest_setup: GuestSetup | None = None,
        resolve: Resolver = resolve_ipv4,
        api_timeout: int = 30,
        task_timeout: float = 600.0,
        agent_timeout: float = 300.0,
        shutdown_timeout: int = 60,
        poll_interval: float = 0.5,
        nextid_attempts: int = 10,
    ):
        if not control_cidrs:
            raise ValueError(
                "control_cidrs (PROXMOX_CONTROL_CIDRS) is empty: the control plane could reach no desktop"
            )
        self._connection = {
            "host": host,
            "user": token_user,
            "token_name": token_name,
            "token_value": token_secret,
            "verify_ssl": verify_ssl,
            "timeout": api_timeout,
        }
        self.templates = templates
        self.bridge = bridge
        self.disk = disk
        self.full_clone = full_clone
        self.clone_storage = clone_storage
        self.ciuser = ciuser
        self.ipconfig = ipconfig
        self.memory_reserve_mib = memory_reserve_mib
        self.cpu_overcommit = cpu_overcommit
        self.anti_affinity = anti_affinity
        self.control_cidrs = control_cidrs
        self.control_tcp_ports = control_tcp_ports
        self.private_cidrs = private_cidrs
        self.warm_pool = warm_pool
        self.warm_pool_running = warm_pool_running
        self.pool_ssh_public_key = pool_ssh_public_key
        self.guest_setup = guest_setup or ssh_guest_setup
        self.resolve = resolve
        self.task_timeout = task_timeout
        self.agent_timeout = agent_timeout
        self.shutdown_timeout = shutdown_timeout
        self.poll_interval = poll_interval
        self.nextid_attempts = nextid_attempts
        self._client: tuple[int, ProxmoxAPI] | None = None
        # Memory and cores promised to clones this process is still making, so concurrent creates
        # spread instead of all picking the same emptiest node.
        self._pending: dict[str, tuple[int, int]] = {}
        # (workspace, node) of those clones, so concurrent creates of one workspace spread too.
        self._pending_workspaces: Counter[tuple[str, str]] = Counter()
        self._pending_lock = threading.RLock()

    @classmethod
    def from_settings(cls) -> ProxmoxDriver:
        # Django only here, so the driver itself stays importable (and testable) without it.
        from django.conf import settings

        from workers.ssh import control_plane_public_key

        return cls(
            host=settings.PROXMOX_HOST,
            token_user=settings.PROXMOX_TOKEN_USER,
            token_name=settings.PROXMOX_TOKEN_NAME,
            token_secret=settings.PROXMOX_TOKEN_SECRET,
            templates=settings.PROXMOX_TEMPLATES,
            verify_ssl={"true": True, "false": False}.get(
                settings.PROXMOX_VERIFY_SSL.lower(), settings.PROXMOX_VERIFY_SSL
            ),
            bridge=settings.PROXMOX_BRIDGE,
            disk=settings.PROXMOX_DISK,
            full_clone=settings.PROXMOX_FULL_CLONE,
            clone_storage=settings.PROXMOX_CLONE_STORAGE,
            ciuser=settings.DESKTOP_SSH_USER,
            ipconfig=settings.PROXMOX_IPCONFIG,
            memory_reserve_mib=settings.PROXMOX_MEMORY_RESERVE_MIB,
            cpu_overcommit=settings.PROXMOX_CPU_OVERCOMMIT,
            anti_affinity=settings.PROXMOX_ANTI_AFFINITY,
            control_cidrs=settings.PROXMOX_CONTROL_CIDRS,
            control_tcp_ports=settings.PROXMOX_CONTROL_TCP_PORTS,
            private_cidrs=settings.PROXMOX_PRIVATE_CIDRS,
            warm_pool=tuple(PoolShape.parse(entry) for entry in settings.PROXMOX_WARM_POOL),
            warm_pool_running=settings.PROXMOX_WARM_POOL_RUNNING,
            pool_ssh_public_key=control_plane_public_key(),
            api_timeout=settings.PROXMOX_API_TIMEOUT,
            task_timeout=settings.PROXMOX_TASK_TIMEOUT,
            agent_timeout=settings.PROXMOX_AGENT_TIMEOUT,
            shutdown_timeout=settings.PROXMOX_SHUTDOWN_TIMEOUT,
        )

    # -- the interface ------------------------------------------------------------------------

    def provision(self, spec: InstanceSpec, progress: Progress = no_progress) -> InstanceStatus:
        key = _checked(spec.key)
        check_spec(spec, min_memory_mib=256)
        tags, name = desktop_tags(key, spec.workspace), vm_name(key)
        progress(ProvisionStep.CLONE)
        vm = self._find(key) or proxmox_pool.claim(self, spec, tags, name)
        if vm is None:
            # The room stays held until the VM runs and counts in the node's own figures.
            with self.placed(spec.memory_mib, spec.vcpus, workspace=spec.workspace) as node:
                vm = self.clone_template(spec.image_profile, node, name)
                progress(ProvisionStep.NETWORK)
                ip = self._personalise(self.wait_unlocked(vm), spec, tags)
        else:
            progress(ProvisionStep.NETWORK)
            ip = self._personalise(self.wait_unlocked(vm), spec, tags)
        progress(ProvisionStep.KEYS)
        self.guest_setup(spec, ip)
        progress(ProvisionStep.READY)
        return InstanceStatus(key=key, state=InstanceState.RUNNING, private_ip=ip, ref=str(vm.vmid))

    def start(self, key: str) -> InstanceStatus:
        vm = self._existing(key, "start")
        self.boot(vm)
        return self._status_of(vm, key)

    def stop(self, key: str) -> InstanceStatus:
        vm = self._existing(key, "stop")
        if vm.status == "running":
            self._power_off(vm)
        return self._status_of(vm, key)

    def suspend(self, key: str) -> InstanceStatus:
        vm = self._existing(key, "suspend")
        if vm.status == "stopped":
            raise DriverError(f"desktop {key} is stopped: there is nothing in memory to suspend")
        if not self._paused(vm):
            self._task(vm, "suspend", self.api_vm(vm).status.suspend.post)
        return self._status_of(vm, key)

    def resume(self, key: str) -> InstanceStatus:
        vm = self._existing(key, "resume")
        if vm.status == "stopped":
            raise DriverError(f"desktop {key} is stopped, not suspended: start it instead")
        if self._paused(vm):
            self._task(vm, "resume", self.api_vm(vm).status.resume.post)
        return self._status_of(vm, key)

    def destroy(self, key: str) -> None:
        vm = self._find(_checked(key))
        if vm is not None:
            self.destroy_vm(self.wait_unlocked(vm))

    def status(self, key: str) -> InstanceStatus:
        vm = self._find(_checked(key))
        if vm is None:
            return InstanceStatus(key=key, state=InstanceState.ABSENT)
        return self._status_of(vm, key)

    def list_instances(self) -> list[InstanceStatus]:
        """Every desktop VM, without addresses: asking each guest agent would make reconciling slow."""
        instances = []
        for vm in self.vms():
            key = _key_of(vm)
            if key:
                state = InstanceState.STOPPED
                if vm.status == "running":
                    state = InstanceState.SUSPENDED if self._paused(vm) else InstanceState.RUNNING
                instances.append(InstanceStatus(key=key, state=state, ref=str(vm.vmid)))
        return instances

    def apply_network_policy(self, key: str, policy: NetworkPolicy) -> None:
        """VM firewall on, inbound only from the control plane, outbound per policy, never to desktops."""
        self.apply_firewall(self._existing(key, "change the network policy of"), policy)

    def apply_firewall(self, vm: PveVm, policy: NetworkPolicy) -> None:
        plan = firewall_plan(
            policy, self.control_cidrs, self.control_tcp_ports, self.private_cidrs, self.resolve
        )
        self.call(f"set the firewall of VM {vm.vmid}", apply_firewall, self.api_vm(vm), plan)

    # -- beyond the interface -----------------------------------------------------------------

    def console(self, key: str) -> ConsoleTicket:
        """The VM's emulated display through PVE: ``vncproxy`` opens it, ``vncwebsocket`` carries it.

        PVE puts VNC authentication in front of it. Its password is the ticket unless one is generated;
        a generated one is asked for, because VNC authentication only uses a password's first eight
        characters and a ticket's are always "PVEVNC:" and a hex digit.
        """
        vm = self._existing(key, "open the console of")
        if vm.status != "running":
            raise DriverError(f"desktop {key} is not running: it has no console")
        proxy = self.call(
            "open the console", self.api_vm(vm).vncproxy.post, websocket=1, **{"generate-password": 1}
        )
        user, token_name, secret = (self._connection[k] for k in ("user", "token_name", "token_value"))
        host = self._connection["host"]
        path = f"/api2/json/nodes/{vm.node}/qemu/{vm.vmid}/vncwebsocket"
        query = f"port={proxy['port']}&vncticket={quote(proxy['ticket'], safe='')}"
        return ConsoleTicket(
            url=f"wss://{host}{path}?{query}",
            password=proxy["password"],
            headers={"Authorization": f"PVEAPIToken={user}!{token_name}={secret}"},
            verify=self._connection["verify_ssl"],
        )

    def refresh_allowed_domains(self) -> dict[str, tuple[str, ...]]:
        """Re-resolve the allowed domains of every desktop VM and bring its IP set up to date.

        Called by a periodic task; returns the new addresses of each desktop whose set changed. A
        desktop whose lookup or update fails keeps its set as it was and is tried again next time.
        """
        changed, lookups = {}, {}

        def resolve(domain: str) -> tuple[str, ...]:
            # Desktops share domains: one lookup per domain and refresh.
            if domain not in lookups:
                lookups[domain] = tuple(self.resolve(domain))
            return lookups[domain]

        for vm in self.vms():
            key = _key_of(vm)
            if not key:
                continue
            firewall = self.api_vm(vm).firewall
            try:
                sets = self.call(f"list the IP sets of VM {vm.vmid}", firewall.ipset.get)
                domains = next((domains_of(s.get("comment", "")) for s in sets if s["name"] == DOMAINS), ())
                if not domains:
                    continue
                addresses = resolved(domains, resolve)
                ipset = firewall.ipset(DOMAINS)
                if self.call(f"refresh the domains of VM {vm.vmid}", converge_ipset, ipset, addresses):
                    changed[key] = addresses
            except DriverError as exc:
                logger.warning("allowed domains of %s not refreshed: %s", key, exc.message)
        return changed

    def refill_pool(self) -> dict[str, int]:
        """Bring every pool flavour to its size on every node: clone what is missing, remove extras.

        Called by a periodic task; returns how many VMs were made (+) or removed (-) per flavour.
        """
        return proxmox_pool.refill(self)

    # -- the API ------------------------------------------------------------------------------

    @property
    def api(self) -> ProxmoxAPI:
        # One client per process: a forked Celery worker must not share its parent's connections.
        if self._client is None or self._client[0] != os.getpid():
            self._client = (os.getpid(), ProxmoxAPI(backend="https", service="PVE", **self._connection))
        return self._client[1]

    def api_vm(self, vm: PveVm):
        return self.api.nodes(vm.node).qemu(vm.vmid)

    def call(self, what: str, function, *args, **kwargs):
        """Run API calls, turning PVE's refusals into driver errors carrying PVE's message."""
        try:
            return function(*args, **kwargs)
        except ResourceException as exc:
            raise self.error(what, exc) from exc
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise TransientDriverError(f"Proxmox did not answer ({what}): {exc}") from exc

    @staticmethod
    def error(what: str, exc: ResourceException) -> DriverError:
        message = _pve_message(exc)
        error = TransientDriverError if _transient(exc.status_code, message) else DriverError
        return error(f"Proxmox refused to {what}: {message}")

    def _task(self, vm: PveVm, what: str, function, **params) -> None:
        upid = self.call(f"{what} VM {vm.vmid}", function, **params)
        self._wait_task(upid, f"{what} VM {vm.vmid}")

    def _wait_task(self, upid: str, what: str, timeout: float | None = None) -> None:
        node = upid.split(":")[1]
        deadline = time.monotonic() + (timeout or self.task_timeout)
        while True:
            task = self.call(f"follow the task of {what}", self.api.nodes(node).tasks(upid).status.get)
            if task["status"] == "stopped":
                exit_status = task.get("exitstatus", "")
                if exit_status == "OK" or exit_status.startswith("WARNINGS"):
                    return
                error = TransientDriverError if _TRANSIENT.search(exit_status) else DriverError
                raise error(f"Proxmox could not {what}: {exit_status}")
            if time.monotonic() > deadline:
                raise TransientDriverError(f"Proxmox is still working to {what} ({upid}); giving up waiting")
            time.sleep(self.poll_interval)

    # -- finding VMs --------------------------------------------------------------------------

    def vms(self) -> list[PveVm]:
        resources = self.call("list VMs", self.api.cluster.resources.get, type="vm")
        return [
            PveVm(
                vmid=int(r["vmid"]),
                node=r["node"],
                name=r.get("name", ""),
                status=r.get("status", "stopped"),
                tags=tuple(t for t in re.split(r"[;, ]+", r.get("tags", "")) if t),
                lock=r.get("lock", ""),
            )
            for r in resources
            if r.get("type") == "qemu" and not r.get("template")
        ]

    def _find(self, key: str) -> PveVm | None:
        name = vm_name(key)
        matches = [vm for vm in self.vms() if key in vm.tags or vm.name == name]
        if len(matches) > 1:
            ids = ", ".join(str(vm.vmid) for vm in matches)
            raise DriverError(f"desktop {key} matches several VMs ({ids}): remove the strays by hand")
        return matches[0] if matches else None

    def _existing(self, key: str, action: str) -> PveVm:
        vm = self._find(_checked(key))
        if vm is None:
            raise DriverError(f"cannot {action} desktop {key}: it has no VM on the Proxmox cluster")
        return self.wait_unlocked(vm)

    def _refresh(self, vm: PveVm) -> dict:
        return self.call(f"read the status of VM {vm.vmid}", self.api_vm(vm).status.current.get)

    def _paused(self, vm: PveVm) -> bool:
        return self._refresh(vm).get("qmpstatus") in ("paused", "suspended")

    def wait_unlocked(self, vm: PveVm) -> PveVm:
        """A VM in the middle of a clone is waited for; any other lock is someone else's work: retry later."""
        deadline = time.monotonic() + self.task_timeout
        while vm.lock:
            if vm.lock != "clone" or time.monotonic() > deadline:
                raise TransientDriverError(f"VM {vm.vmid} is locked ({vm.lock}); retrying later")
            time.sleep(self.poll_interval)
            current = self._refresh(vm)
            vm.lock, vm.status = current.get("lock", ""), current["status"]
        vm.status = self._refresh(vm)["status"]
        return vm

    def _status_of(self, vm: PveVm, key: str) -> InstanceStatus:
        current = self._refresh(vm)
        if current["status"] == "stopped":
            return InstanceStatus(key=key, state=InstanceState.STOPPED, ref=str(vm.vmid))
        if current.get("qmpstatus") in ("paused", "suspended"):
            return InstanceStatus(key=key, state=InstanceState.SUSPENDED, ref=str(vm.vmid))
        ip = self.call(f"ask the guest agent of VM {vm.vmid}", self._ip, vm)
        return InstanceStatus(key=key, state=InstanceState.RUNNING, private_ip=ip, ref=str(vm.vmid))

    def _ip(self, vm: PveVm) -> str | None:
        """The guest's first global IPv4 address as its agent reports it; None while the agent is not up."""
        try:
            answer = self.api_vm(vm).agent("network-get-interfaces").get()
        except ResourceException as exc:
            if _AGENT_NOT_READY.search(_pve_message(exc)):
                return None
            raise
        for interface in answer.get("result", []):
            if interface.get("name") == "lo":
                continue
            for address in interface.get("ip-addresses", []):
                ip = address.get("ip-address", "")
                if address.get("ip-address-type") == "ipv4" and not ip.startswith(("127.", "169.254.")):
                    return ip
        return None

    def _wait_for_ip(self, vm: PveVm) -> str:
        deadline = time.monotonic() + self.agent_timeout
        while True:
            ip = self.call(f"ask the guest agent of VM {vm.vmid}", self._ip, vm)
            if ip:
                return ip
            if time.monotonic() > deadline:
                raise TransientDriverError(
                    f"VM {vm.vmid} started but its guest agent reported no address "
                    f"within {self.agent_timeout:.0f} s"
                )
            time.sleep(self.poll_interval)

    # -- making VMs ---------------------------------------------------------------------------

    def clone_template(self, profile: str, node: str, name: str) -> PveVm:
        """Clone the profile's template onto ``node`` under a fresh VMID, retrying when one is taken."""
        template = self._template(profile)
        params = {"name": name, "full": int(self.full_clone)}
        if node != template.node:
            params["target"] = node
        if self.full_clone and self.clone_storage:
            params["storage"] = self.clone_storage
        source = self.api_vm(template)
        for _ in range(self.nextid_attempts):
            vmid = int(self.call("pick a VMID", self.api.cluster.nextid.get))
            try:
                upid = source.clone.post(newid=vmid, **params)
            except ResourceException as exc:
                # nextid is not a reservation: another worker may have taken it since.
                if _ALREADY_EXISTS.search(_pve_message(exc)):
                    continue
                raise self.error(f"clone template {template.vmid}", exc) from exc
            vm = PveVm(vmid, node, name, "stopped", (), "clone")
            self._wait_task(upid, f"clone template {template.vmid} into VM {vmid}")
            vm.lock = ""
            return vm
        raise TransientDriverError(
            f"every VMID Proxmox offered was taken first ({self.nextid_attempts} tries)"
        )

    def _template(self, profile: str) -> PveVm:
        vmid = self.templates.get(profile)
        if vmid is None:
            known = ", ".join(sorted(self.templates)) or "none"
            raise DriverError(f"no Proxmox template for the image profile {profile!r} (configured: {known})")
        resources = self.call("list VMs", self.api.cluster.resources.get, type="vm")
        found = next((r for r in resources if int(r.get("vmid", 0)) == vmid), None)
        if found is None or not found.get("template"):
            raise DriverError(f"the template VM {vmid} of profile {profile!r} is missing or not a template")
        return PveVm(vmid, found["node"], found.get("name", ""), "stopped", (), "")

    def configure_hardware(
        self, vm: PveVm, vcpus: int, memory_mib: int, disk_gib: int, tags: tuple[str, ...]
    ) -> None:
        """Caps, NIC with the firewall on, guest agent, tags; the disk only ever grows."""
        self.call(
            f"configure VM {vm.vmid}",
            self.api_vm(vm).config.put,
            cores=vcpus,
            memory=str(memory_mib),
            agent="1",
            net0=f"virtio,bridge={self.bridge},firewall=1",
            tags=";".join(tags),
        )
        config = self.call(f"read the config of VM {vm.vmid}", self.api_vm(vm).config.get)
        if _disk_gib(config.get(self.disk, "")) < disk_gib:
            self._task(
                vm, "resize the disk of", self.api_vm(vm).resize.put, disk=self.disk, size=f"{disk_gib}G"
            )
        vm.tags = tags

    def configure_cloud_init(self, vm: PveVm, ssh_public_key: str, digest: str | None = None) -> None:
        self.call(
            f"set cloud-init on VM {vm.vmid}",
            self.api_vm(vm).config.put,
            ciuser=self.ciuser,
            # PVE wants the keys URL-encoded with spaces as %20, never '+'.
            sshkeys=quote(ssh_public_key.strip(), safe=""),
            ipconfig0=self.ipconfig,
            digest=digest,
        )

    def _personalise(self, vm: PveVm, spec: InstanceSpec, tags: tuple[str, ...]) -> str:
        """A stopped VM gets the plan, cloud-init and the firewall, then boots; returns its address."""
        if vm.status == "stopped":
            self.configure_hardware(vm, spec.vcpus, spec.memory_mib, spec.disk_gib, tags)
            self.configure_cloud_init(vm, spec.ssh_public_key)
            self.apply_firewall(vm, NetworkPolicy())
        return self.boot(vm)

    def boot(self, vm: PveVm) -> str:
        """Start or resume the VM as needed and wait for its guest agent's address."""
        if vm.status == "stopped":
            self._task(vm, "start", self.api_vm(vm).status.start.post)
            vm.status = "running"
        elif self._paused(vm):
            self._task(vm, "resume", self.api_vm(vm).status.resume.post)
        return self._wait_for_ip(vm)

    def _power_off(self, vm: PveVm) -> None:
        """A clean shutdown first; a guest that ignores it (or is paused) is stopped hard."""
        if not self._paused(vm):
            upid = self.call(
                f"shut down VM {vm.vmid}", self.api_vm(vm).status.shutdown.post, timeout=self.shutdown_timeout
            )
            with contextlib.suppress(DriverError):
                self._wait_task(upid, f"shut down VM {vm.vmid}", timeout=self.shutdown_timeout + 30)
                return
        self._task(vm, "stop", self.api_vm(vm).status.stop.post)

    def destroy_vm(self, vm: PveVm) -> None:
        if vm.status == "running":
            self._task(vm, "stop", self.api_vm(vm).status.stop.post)
        self._task(vm, "destroy", self.api_vm(vm).delete, purge=1, **{"destroy-unreferenced-disks": 1})

    # -- placement ----------------------------------------------------------------------------

    def node_room(self) -> dict[str, tuple[int, float]]:
        """Free memory (MiB, after the reserve) and free vCPUs (after overcommit) of each online node."""
        resources = self.call("read the cluster's resources", self.api.cluster.resources.get)
        room = {}
        vms = [r for r in resources if r.get("type") == "qemu" and r.get("status") == "running"]
        with self._pending_lock:
            pending = dict(self._pending)
        for node in resources:
            if node.get("type") != "node" or node.get("status") != "online":
                continue
            name = node["node"]
            committed = sum(int(r.get("maxmem", 0)) for r in vms if r["node"] == name) // MIB
            cores = sum(int(r.get("maxcpu", 0)) for r in vms if r["node"] == name)
            extra_mem, extra_cores = pending.get(name, (0, 0))
            used = max(int(node.get("mem", 0)) // MIB, committed) + extra_mem
            free_mem = int(node["maxmem"]) // MIB - self.memory_reserve_mib - used
            free_cpu = int(node["maxcpu"]) * self.cpu_overcommit - cores - extra_cores
            room[name] = (free_mem, free_cpu)
        return room

    def crowded_nodes(self, workspace: str) -> set[str]:
        """The nodes placement avoids for a new desktop of ``workspace``: those already holding one.

        Empty unless anti-affinity is on. A VM counts whatever its state: a stopped one starts there.
        """
        if not (self.anti_affinity and workspace):
            return set()
        tag = workspace_tag(workspace)
        with self._pending_lock:
            pending = {n for w, n in self._pending_workspaces if w == workspace}
            return pending | {vm.node for vm in self.vms() if tag in vm.tags}

    @contextlib.contextmanager
    def placed(self, memory_mib: int, vcpus: int, node: str | None = None, workspace: str = ""):
        """Pick the node with the most free memory that fits, and hold the room until the VM runs."""
        with self._pending_lock:
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
                    f"{self.memory_reserve_mib} MiB reserve ({best or 'no node online'})"
                )
            chosen = max(fitting, key=lambda n: fitting[n])
            mem, cores = self._pending.get(chosen, (0, 0))
            self._pending[chosen] = (mem + memory_mib, cores + vcpus)
            self._pending_workspaces[(workspace, chosen)] += 1
        try:
            yield chosen
        finally:
            with self._pending_lock:
                mem, cores = self._pending[chosen]
                self._pending[chosen] = (mem - memory_mib, cores - vcpus)
                # In-place subtraction drops the counts that reach zero.
                self._pending_workspaces -= Counter({(workspace, chosen): 1})


def vm_name(key: str) -> str:
    """The VM's name, which cloud-init also makes the guest's first hostname."""
    return guest_hostname(key)


def workspace_tag(workspace: str) -> str:
    return WORKSPACE_TAG + workspace


def desktop_tags(key: str, workspace: str) -> tuple[str, ...]:
    """Our owner tag, the desktop's key and, when known, its workspace."""
    if not workspace:
        return (OWNER_TAG, key)
    if not _KEY.fullmatch(workspace):
        raise DriverError(
            f"{workspace!r} is not a valid workspace id (lowercase letters, digits, '_' and '-')"
        )
    return (OWNER_TAG, key, workspace_tag(workspace))


def _key_of(vm: PveVm) -> str:
    """The desktop key among a VM's tags; VMs without our owner tag (or pool members) have none."""
    if OWNER_TAG not in vm.tags:
        return ""
    return next((t for t in vm.tags if t != OWNER_TAG and not t.startswith(WORKSPACE_TAG)), "")


def _checked(key: str) -> str:
    # Keys become PVE tags and VM names: lowercase letters, digits, '_' and '-'.
    if not _KEY.fullmatch(key or ""):
        raise DriverError(f"{key!r} is not a valid desktop key (lowercase letters, digits, '_' and '-')")
    return key


def _pve_message(exc: ResourceException) -> str:
    message = (exc.content or exc.status_message or "").strip()
    if exc.errors:
        details = exc.errors if isinstance(exc.errors, dict) else {"": exc.errors}
        message += " " + "; ".join(f"{k}: {v}".strip(": ") for k, v in details.items())
    return message


def _transient(status: int, message: str) -> bool:
    return status >= 502 or status == 429 or (status == 500 and bool(_TRANSIENT.search(message)))


def _disk_gib(disk: str) -> float:
    match = _DISK_SIZE.search(disk)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else 0.0
