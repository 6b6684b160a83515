"""The LXC engine's options, read from its own environment variables (``LXC_*``)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from environs import Env

from workers.drivers.base import PoolShape, host_nameservers
from workers.drivers.lxc.network import DENIED_CIDRS, TABLE, VETH_PREFIX, HostLimits

# The control plane's guest endpoint port, the one port of the host desktops need by default.
GUEST_PORT = 8001
# One desktop of the smallest plan on the full image booted ahead of demand: a create takes it, and
# its agent has started and warmed up by then (about twenty seconds of CPU on two cores).
DEFAULT_WARM_POOL = ("full:1:2048:10=1",)


@dataclass(frozen=True)
class LxcConfig:
    """Where desktops live on this machine and how they are networked.

    Tests and benches run beside a production engine on one host by giving theirs another bridge,
    subnet, firewall table, veth prefix and directories.
    """

    images_dir: Path = Path("/var/lib/lebureau/images")
    state_dir: Path = Path("/var/lib/lebureau/desktops")
    lxc_path: Path = Path("/var/lib/lebureau/lxc")
    lock_dir: Path = Path("/run/lebureau/locks")
    bridge: str = "lbbr0"
    subnet: str = "10.213.0.0/24"
    nft_table: str = TABLE
    veth_prefix: str = VETH_PREFIX
    # The guests' ids are mapped from here on the host (the golden image is built for it).
    id_base: int = 100000
    id_count: int = 65536
    # TCP ports of this host that desktops may open: the control plane's guest endpoint (GUEST_PORT).
    host_tcp_ports: tuple[int, ...] = (GUEST_PORT,)
    # Destinations no desktop ever reaches, whatever its egress policy.
    denied_cidrs: tuple[str, ...] = DENIED_CIDRS
    # Where each desktop's resolver (on this host) sends the names it allows.
    upstream_dns: tuple[str, ...] = field(default_factory=host_nameservers)
    # Each desktop's resolver listens on the host's bridge address, at this port plus the desktop's
    # place in the subnet.
    resolver_port_base: int = 30000
    # What must answer before a desktop counts as up (SSH, VNC), and for how long to wait.
    ready_ports: tuple[int, ...] = (22, 5900)
    ready_timeout: float = 30.0
    stop_timeout: int = 10
    # Each desktop's claim on a contended CPU, beside a host process's 100 (cgroup v2's cpu.weight):
    # ten busy desktops would otherwise leave the control plane on the same host a sliver of it.
    cpu_weight: int = 25
    # What each desktop may spend of the host's connection tracking, DNS and pings.
    host_limits: HostLimits = field(default_factory=HostLimits)
    # Desktops booted ahead of demand, each shape refilled by the engine's periodic work.
    warm_pool: tuple[PoolShape, ...] = ()

    def __post_init__(self):
        if not re.fullmatch(r"[a-z][a-z0-9]{1,4}", self.veth_prefix):
            raise ValueError(f"veth_prefix {self.veth_prefix!r}: 2 to 5 lowercase letters or digits")
        if not 1024 <= self.resolver_port_base <= 65535 - ipaddress.ip_network(self.subnet).num_addresses:
            raise ValueError(f"resolver_port_base {self.resolver_port_base}: no room for a port per address")

    @classmethod
    def from_env(cls, env: Env | None = None) -> LxcConfig:
        env = env or Env()
        defaults = cls.__dataclass_fields__
        return cls(
            images_dir=env.path("LXC_IMAGES_DIR", defaults["images_dir"].default),
            state_dir=env.path("LXC_STATE_DIR", defaults["state_dir"].default),
            lxc_path=env.path("LXC_PATH", defaults["lxc_path"].default),
            lock_dir=env.path("LXC_LOCK_DIR", defaults["lock_dir"].default),
            bridge=env.str("LXC_BRIDGE", defaults["bridge"].default),
            subnet=env.str("LXC_SUBNET", defaults["subnet"].default),
            nft_table=env.str("LXC_NFT_TABLE", defaults["nft_table"].default),
            veth_prefix=env.str("LXC_VETH_PREFIX", defaults["veth_prefix"].default),
            host_tcp_ports=tuple(env.list("LXC_HOST_TCP_PORTS", [GUEST_PORT], subcast=int)),
            denied_cidrs=tuple(env.list("LXC_DENIED_CIDRS", list(DENIED_CIDRS))),
            upstream_dns=tuple(env.list("LXC_UPSTREAM_DNS", list(host_nameservers()))),
            resolver_port_base=env.int("LXC_RESOLVER_PORT_BASE", defaults["resolver_port_base"].default),
            cpu_weight=env.int("LXC_CPU_WEIGHT", defaults["cpu_weight"].default),
            host_limits=HostLimits(
                connections=env.int("LXC_CONNECTIONS_PER_DESKTOP", HostLimits.connections),
                dns_per_second=env.int("LXC_DNS_PER_SECOND", HostLimits.dns_per_second),
                pings_per_second=env.int("LXC_PINGS_PER_SECOND", HostLimits.pings_per_second),
            ),
            warm_pool=tuple(PoolShape.parse(e) for e in env.list("LXC_WARM_POOL", list(DEFAULT_WARM_POOL))),
        )
