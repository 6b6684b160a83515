"""The one interface every compute engine implements.

Every method is idempotent and keyed by the desktop's public id (``key``), so a
task that is retried or delivered twice converges instead of failing.
"""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from workers.drivers.ssh import control_plane_public_key


class DriverError(Exception):
    """A driver step failed. Permanent unless raised as :class:`TransientDriverError`.

    ``message`` is for the operators (it may name host paths, nodes, storage). ``reason``, one of
    REASONS, is what the desktop's owner is told (in their language, by the domain); without one,
    they are told in general words that the engine failed.
    """

    transient = False

    def __init__(self, message: str, *, reason: str = ""):
        super().__init__(message)
        self.message = message
        self.reason = reason


# Failures whose cause the desktop's owner can act on.
NO_CAPACITY = "no_capacity"
INVALID_SPEC = "invalid_spec"
IMAGE_MISSING = "image_missing"
NOT_SUSPENDABLE = "not_suspendable"
NOT_RESUMABLE = "not_resumable"
NOT_PROVISIONED = "not_provisioned"


class TransientDriverError(DriverError):
    """A failure worth retrying with backoff (engine busy, lock held, timeout)."""

    transient = True


class InstanceState(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    SUSPENDED = "suspended"
    ABSENT = "absent"


class ProvisionStep(StrEnum):
    """The steps of a provision a person sees: the same words whatever the engine."""

    CLONE = "clone"
    NETWORK = "network"
    KEYS = "keys"
    BOOT = "boot"
    READY = "ready"


Progress = Callable[[ProvisionStep], None]


def no_progress(step: ProvisionStep) -> None:
    """The default listener: nobody is watching."""


@dataclass(frozen=True)
class BlockedDestination:
    """An address an instance tried to reach and its egress policy refused."""

    address: str
    packets: int
    seconds_ago: int


@dataclass(frozen=True)
class BlockedEgress:
    """What an instance tried to reach and its egress policy refused, the latest first."""

    # Names its resolver answered "no such domain" for, with how many look-ups.
    names: tuple[tuple[str, int], ...]
    addresses: tuple[BlockedDestination, ...]


def host_nameservers() -> tuple[str, ...]:
    """The host's own resolvers, where the desktops' resolvers (on the host) send the names they allow."""
    servers = []
    with contextlib.suppress(OSError), open("/etc/resolv.conf") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver":
                servers.append(fields[1])
    return tuple(servers)


_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
# A name a policy may allow: at least two labels, the last not all digits (an address is never taken
# for a name), optionally "*." for its subdomains only. Nothing else: names end up in engines'
# configuration files.
ALLOWED_DOMAIN = re.compile(rf"(?=.{{1,253}}$)(\*\.)?({_LABEL}\.)+(?![0-9]+$){_LABEL}")


@dataclass(frozen=True)
class NetworkPolicy:
    """Egress rules for one desktop; desktops never reach each other whatever this says."""

    allow_internet: bool = True
    allowed_cidrs: tuple[str, ...] = ()
    # Names whose current addresses are allowed, for services whose addresses change; engines that
    # support them re-resolve them periodically.
    allowed_domains: tuple[str, ...] = ()


@dataclass(frozen=True)
class InstanceSpec:
    """What ``provision`` needs: the plan's caps and how the control plane gets in."""

    key: str
    hostname: str
    vcpus: int
    memory_mib: int
    disk_gib: int
    ssh_public_key: str
    image_profile: str = "minimal"
    # The workspace the desktop belongs to, for engines that spread a workspace's desktops.
    workspace: str = ""
    # Where the desktop may connect from its first boot on (later changes: ``apply_network_policy``).
    network_policy: NetworkPolicy = field(default_factory=NetworkPolicy)
    # Extra files written into the guest at provision (path -> text or bytes), e.g. the
    # desktop-scoped token of the `bureau` helper.
    files: dict[str, str | bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceStatus:
    key: str
    state: InstanceState
    private_ip: str | None = None
    # The engine's own name for the instance (container name, VMID).
    ref: str = ""


@dataclass(frozen=True)
class ConsoleTicket:
    """What the VNC relay needs to reach an instance's screen through its engine rather than the guest.

    Open ``url`` as a WebSocket with ``headers`` (verifying TLS per ``verify``: True, False or a CA
    bundle's path), then speak RFB, answering its VNC authentication with ``password``.
    """

    url: str
    password: str
    headers: dict[str, str]
    verify: bool | str = True


@dataclass(frozen=True)
class InstanceUsage:
    memory_bytes: int
    cpu_seconds: float


_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def guest_hostname(name: str) -> str:
    """The hostname the guest gets: keys like ``dsk_ab12`` make good names but DNS names have no '_'."""
    return name.replace("_", "-")


def check_spec(spec: InstanceSpec, *, min_memory_mib: int) -> None:
    """Refuse, permanently and in words, what no engine can build."""
    if not _HOSTNAME.fullmatch(guest_hostname(spec.hostname)):
        raise DriverError(
            f"{spec.hostname!r} is not a valid hostname (letters, digits and '-', at most 63)",
            reason=INVALID_SPEC,
        )
    if spec.vcpus < 1 or spec.memory_mib < min_memory_mib or spec.disk_gib < 1:
        raise DriverError(
            f"desktop {spec.key} needs at least 1 vCPU, {min_memory_mib} MiB of memory and 1 GiB of disk "
            f"(asked: {spec.vcpus}, {spec.memory_mib} MiB, {spec.disk_gib} GiB)",
            reason=INVALID_SPEC,
        )


@dataclass(frozen=True)
class ControlPlane:
    """What every engine is told of the control plane driving it: how it logs into desktops."""

    ssh_key_path: Path
    ssh_user: str = "agent"

    @property
    def ssh_public_key(self) -> str:
        return control_plane_public_key(self.ssh_key_path)


@dataclass(frozen=True)
class PoolShape:
    """One flavour of an engine's warm pool, i.e. one plan's needs and an image: ``size`` members
    (on every node, for an engine of several)."""

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


class ComputeDriver(abc.ABC):
    name: str = ""

    @property
    def instance_id(self) -> str:
        """Which installation of the engine this is (a host, a cluster): two control planes, or two
        hosts behind one, share a database, and each judges only the desktops its own engine holds."""
        return self.name

    @classmethod
    def from_env(cls, control_plane: ControlPlane) -> ComputeDriver:
        """Build the driver from its own environment variables; engines with options override this."""
        return cls()

    @abc.abstractmethod
    def provision(self, spec: InstanceSpec, progress: Progress = no_progress) -> InstanceStatus:
        """Create the instance from the golden image and start it, naming each step as it begins."""

    @abc.abstractmethod
    def start(self, key: str) -> InstanceStatus: ...

    @abc.abstractmethod
    def stop(self, key: str) -> InstanceStatus:
        """Power off, keeping the disk."""

    @abc.abstractmethod
    def suspend(self, key: str) -> InstanceStatus:
        """Pause, keeping memory."""

    @abc.abstractmethod
    def resume(self, key: str) -> InstanceStatus: ...

    @abc.abstractmethod
    def destroy(self, key: str) -> None:
        """Remove the instance and wipe its disk; a missing instance is not an error."""

    @abc.abstractmethod
    def status(self, key: str) -> InstanceStatus:
        """Current state; ``ABSENT`` when the engine has no such instance."""

    @abc.abstractmethod
    def list_instances(self) -> list[InstanceStatus]:
        """Every instance this control plane owns on the engine, for reconciling."""

    @abc.abstractmethod
    def apply_network_policy(self, key: str, policy: NetworkPolicy) -> None: ...

    def blocked_egress(self, key: str) -> BlockedEgress | None:
        """What the instance tried to reach and its egress policy refused, the latest first; None where
        the engine cannot tell."""
        return None

    def usage(self, key: str) -> InstanceUsage | None:
        """What the instance uses now, where the engine can tell; None where it cannot."""
        return None

    def disk_usage(self, key: str) -> int | None:
        """Bytes the instance's disk holds, for billing its storage; None where the engine cannot tell now.

        Optional: an engine without it is billed no storage.
        """
        return None

    def console(self, key: str) -> ConsoleTicket:
        """A one-time way to the instance's own console, for when the guest's VNC server is unreachable."""
        raise DriverError(f"the {self.name or type(self).__name__} engine has no console of its own")

    def image_metadata(self, key: str) -> dict:
        """What the engine knows of the image the instance was made from (profile, build, packages)."""
        return {}

    def maintenance(self) -> dict:
        """The engine's own periodic work (a warm pool to refill, say), run by one generic beat task.

        Returns what it did, for the task's log; engines with nothing to do keep this default.
        """
        return {}
