"""The Proxmox engine's options, read from its own environment variables (``PROXMOX_*``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from environs import Env

from workers.drivers.base import DriverError, PoolShape, host_nameservers

# Never reachable from a desktop: private networks, link-local (a cloud's metadata service among them),
# and their IPv6 counterparts.
DEFAULT_PRIVATE_CIDRS = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "fc00::/7",
    "fe80::/10",
)


@dataclass(frozen=True)
class ProxmoxConfig:
    # The cluster's API and the token the control plane uses on it.
    host: str
    token_user: str
    token_name: str
    token_secret: str
    # One template VMID per image profile ({"full": 9001, "minimal": 9000}).
    templates: dict[str, int]
    # Where the control plane's connections come from: the only source allowed to desktops' SSH and VNC.
    control_cidrs: tuple[str, ...]
    # True, False, or the path of the CA bundle that signed the cluster's certificate.
    verify_ssl: bool | str = True
    bridge: str = "vmbr0"
    disk: str = "scsi0"
    full_clone: bool = False
    clone_storage: str = ""
    # The desktops' network on the bridge. The control plane gives each VM its address (the network's
    # address plus its VMID, unique in the cluster) through cloud-init and pins it in the firewall: it is
    # never taken from the guest, which root inside controls.
    subnet: str = "10.80.0.0/16"
    gateway: str = ""
    memory_reserve_mib: int = 2048
    cpu_overcommit: float = 4.0
    # Place a new desktop on a node holding no other desktop of its workspace, while one fits.
    anti_affinity: bool = False
    # Ports of the control plane's addresses that desktops may open (none: its pages and API stay out
    # of their reach).
    control_tcp_ports: tuple[int, ...] = ()
    private_cidrs: tuple[str, ...] = DEFAULT_PRIVATE_CIDRS
    # VMs cloned ahead of demand on every node, per plan shape; booted unless told otherwise.
    warm_pool: tuple[PoolShape, ...] = ()
    warm_pool_running: bool = True
    # Seconds between two re-resolutions of the desktops' allowed domains into their IP sets (the same
    # refresh removes the addresses the desktops' resolver added once their time is up).
    domain_refresh_interval: float = 300.0
    # The desktops' resolver (``resolver``): the address VMs send DNS to (their cloud-init nameserver, the
    # only DNS server their firewall lets them reach), and where the service listens (``host:port``; by
    # default that address, port 53). Empty: no resolver, and wildcard domains cannot be allowed.
    resolver_address: str = ""
    resolver_listen: str = ""
    # Where it sends the names a desktop may resolve (``host`` or ``host:port``): the host's resolvers.
    resolver_upstreams: tuple[str, ...] = field(default_factory=host_nameservers)
    # The longest TTL a desktop is told; an answered address stays in its set that long plus a grace.
    resolver_max_ttl: int = 300
    resolver_grace: int = 60
    # Seconds the resolver trusts what it read of a VM (its policy, its set) before reading it again.
    resolver_policy_ttl: float = 5.0
    resolver_upstream_timeout: float = 3.0
    # Seconds between two writes of the names the resolver refused a VM (into its firewall, see
    # ``blocked``): a burst of refused look-ups costs one write per this while, not one each.
    resolver_refused_interval: float = 5.0
    # One resolver serves every tenant: the threads answering at once (past them, queries wait, and past
    # as many waiting are dropped: a DNS client asks again), the queries a second one VM may ask (twice
    # as many in a burst; past it, refused), and the answered addresses one VM's set may hold.
    resolver_threads: int = 16
    resolver_queries_per_second: float = 50.0
    resolver_max_addresses: int = 1024
    api_timeout: int = 30
    task_timeout: float = 600.0
    agent_timeout: float = 300.0
    shutdown_timeout: int = 60
    poll_interval: float = 0.5
    nextid_attempts: int = 10

    def __post_init__(self):
        if not self.control_cidrs:
            raise ValueError(
                "control_cidrs (PROXMOX_CONTROL_CIDRS) is empty: the control plane could reach no desktop"
            )
        network = ipaddress.IPv4Network(self.subnet)
        if self.gateway and ipaddress.IPv4Address(self.gateway) not in network:
            raise ValueError(
                f"the gateway {self.gateway} (PROXMOX_GATEWAY) is not in {network} (PROXMOX_SUBNET)"
            )
        if self.resolver_address:
            ipaddress.IPv4Address(self.resolver_address)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def gateway_address(self) -> str:
        return self.gateway or str(self.network.network_address + 1)

    @property
    def resolver_bind(self) -> tuple[str, int]:
        """Where the desktops' resolver listens."""
        listen = self.resolver_listen or f"{self.resolver_address}:53"
        host, _, port = listen.rpartition(":")
        return host, int(port)

    def vmid_at(self, address: str) -> int | None:
        """The VMID whose address this is (the inverse of ``address_of``), or None for any other."""
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            return None
        network = self.network
        if ip not in network or ip in (network.network_address, network.broadcast_address):
            return None
        vmid = int(ip) - int(network.network_address)
        return vmid if vmid >= 100 and str(ip) != self.gateway_address else None

    def address_of(self, vmid: int) -> str:
        """The address of the VM with this VMID: the network's address plus the VMID."""
        network = self.network
        address = network.network_address + vmid
        if (
            address not in network
            or address == network.broadcast_address
            or str(address) == self.gateway_address
        ):
            raise DriverError(
                f"VM {vmid} has no address in {network}: widen PROXMOX_SUBNET to hold every VMID"
            )
        return str(address)

    @classmethod
    def from_env(cls, env: Env | None = None) -> ProxmoxConfig:
        env = env or Env()
        defaults = {name: f.default for name, f in cls.__dataclass_fields__.items()}
        verify = env.str("PROXMOX_VERIFY_SSL", "true")
        return cls(
            host=env.str("PROXMOX_HOST", "127.0.0.1:8006"),
            token_user=env.str("PROXMOX_TOKEN_USER", "lebureau@pve"),
            token_name=env.str("PROXMOX_TOKEN_NAME", "driver"),
            token_secret=env.str("PROXMOX_TOKEN_SECRET", ""),
            templates=env.dict("PROXMOX_TEMPLATES", {}, subcast_values=int),
            control_cidrs=tuple(env.list("PROXMOX_CONTROL_CIDRS", [])),
            verify_ssl={"true": True, "false": False}.get(verify.lower(), verify),
            bridge=env.str("PROXMOX_BRIDGE", defaults["bridge"]),
            disk=env.str("PROXMOX_DISK", defaults["disk"]),
            full_clone=env.bool("PROXMOX_FULL_CLONE", defaults["full_clone"]),
            clone_storage=env.str("PROXMOX_CLONE_STORAGE", defaults["clone_storage"]),
            subnet=env.str("PROXMOX_SUBNET", defaults["subnet"]),
            gateway=env.str("PROXMOX_GATEWAY", defaults["gateway"]),
            memory_reserve_mib=env.int("PROXMOX_MEMORY_RESERVE_MIB", defaults["memory_reserve_mib"]),
            cpu_overcommit=env.float("PROXMOX_CPU_OVERCOMMIT", defaults["cpu_overcommit"]),
            anti_affinity=env.bool("PROXMOX_ANTI_AFFINITY", defaults["anti_affinity"]),
            control_tcp_ports=tuple(env.list("PROXMOX_CONTROL_TCP_PORTS", [], subcast=int)),
            private_cidrs=tuple(env.list("PROXMOX_PRIVATE_CIDRS", list(DEFAULT_PRIVATE_CIDRS))),
            warm_pool=tuple(PoolShape.parse(entry) for entry in env.list("PROXMOX_WARM_POOL", [])),
            warm_pool_running=env.bool("PROXMOX_WARM_POOL_RUNNING", defaults["warm_pool_running"]),
            domain_refresh_interval=env.float(
                "PROXMOX_DOMAIN_REFRESH_INTERVAL", defaults["domain_refresh_interval"]
            ),
            resolver_address=env.str("PROXMOX_RESOLVER_ADDRESS", defaults["resolver_address"]),
            resolver_listen=env.str("PROXMOX_RESOLVER_LISTEN", defaults["resolver_listen"]),
            resolver_upstreams=tuple(env.list("PROXMOX_RESOLVER_UPSTREAMS", list(host_nameservers()))),
            resolver_max_ttl=env.int("PROXMOX_RESOLVER_MAX_TTL", defaults["resolver_max_ttl"]),
            resolver_grace=env.int("PROXMOX_RESOLVER_GRACE", defaults["resolver_grace"]),
            resolver_policy_ttl=env.float("PROXMOX_RESOLVER_POLICY_TTL", defaults["resolver_policy_ttl"]),
            resolver_refused_interval=env.float(
                "PROXMOX_RESOLVER_REFUSED_INTERVAL", defaults["resolver_refused_interval"]
            ),
            resolver_threads=env.int("PROXMOX_RESOLVER_THREADS", defaults["resolver_threads"]),
            resolver_queries_per_second=env.float(
                "PROXMOX_RESOLVER_QUERIES_PER_SECOND", defaults["resolver_queries_per_second"]
            ),
            resolver_max_addresses=env.int(
                "PROXMOX_RESOLVER_MAX_ADDRESSES", defaults["resolver_max_addresses"]
            ),
            api_timeout=env.int("PROXMOX_API_TIMEOUT", defaults["api_timeout"]),
            task_timeout=env.float("PROXMOX_TASK_TIMEOUT", defaults["task_timeout"]),
            agent_timeout=env.float("PROXMOX_AGENT_TIMEOUT", defaults["agent_timeout"]),
            shutdown_timeout=env.int("PROXMOX_SHUTDOWN_TIMEOUT", defaults["shutdown_timeout"]),
        )
