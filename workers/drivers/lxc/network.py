"""The LXC driver's host network: the project's bridge and its nftables tables.

The firewall is declarative: :func:`render_ruleset` turns the bridge settings and every desktop's
address and egress policy into the whole of the project's two nftables tables, and :func:`apply`
replaces them in one atomic ``nft -f`` transaction. Rebuilding everything on each change keeps it
idempotent and self-healing (a host reboot or a hand edit is repaired by the next change).

Run as a module to create the bridge and an empty firewall (``image-build/host-setup.sh`` does)::

    python3 workers/drivers/lxc/network.py --bridge lbbr0 --subnet 10.213.0.0/24
"""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
from dataclasses import dataclass, field

TABLE = "lebureau"
# Host-side names of the desktops' veth interfaces start with this. Bridge-family rules see every
# bridge of the host and this kernel cannot match on the bridge's name, so each driver instance
# (production, tests, bench) has its own prefix and its bridge rules only touch its own ports.
VETH_PREFIX = "lbv"


# Never reachable from a desktop, whatever its egress policy: this host's and its neighbours' private
# networks, link-local (169.254.169.254 is a cloud's metadata service: the host's own credentials),
# loopback, shared and reserved space, multicast.
DENIED_CIDRS = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
)


@dataclass(frozen=True)
class DesktopRules:
    ip: str
    # The host side of the desktop's veth and the desktop's MAC: its frames may only carry its own
    # MAC and address, untagged.
    veth: str
    mac: str
    allow_internet: bool = True
    allowed_cidrs: tuple[str, ...] = field(default_factory=tuple)


def gateway_of(subnet: str) -> str:
    """The host's address on the bridge: the subnet's first address."""
    return str(next(ipaddress.ip_network(subnet).hosts()))


def render_ruleset(
    bridge: str,
    subnet: str,
    desktops: list[DesktopRules],
    host_tcp_ports: tuple[int, ...],
    table: str = TABLE,
    veth_prefix: str = VETH_PREFIX,
    denied_cidrs: tuple[str, ...] = DENIED_CIDRS,
    dns_servers: tuple[str, ...] = (),
) -> str:
    gateway = gateway_of(subnet)
    ips = sorted({d.ip for d in desktops}, key=ipaddress.ip_address)
    no_internet = sorted({d.ip for d in desktops if not d.allow_internet}, key=ipaddress.ip_address)
    bindings = sorted(f'"{d.veth}" . {d.mac} . {d.ip}' for d in desktops)
    denied = sorted({str(ipaddress.ip_network(c)) for c in denied_cidrs}, key=ipaddress.ip_network)
    egress = sorted(
        {
            f"{d.ip} . {ipaddress.ip_network(c, strict=False)}"
            for d in desktops
            if not d.allow_internet
            for c in d.allowed_cidrs
        }
    )

    def elements(items: list[str]) -> str:
        return f"elements = {{ {', '.join(items)} }}" if items else ""

    # The resolvers desktops are given may sit in a denied network: port 53 of them stays open.
    resolvers = sorted(
        {d for d in dns_servers if ipaddress.ip_address(d).version == 4}, key=ipaddress.ip_address
    )
    dns_rule = ""
    if resolvers:
        to_resolvers = f'iifname "{bridge}" ip daddr {{ {", ".join(resolvers)} }}'
        dns_rule = f"{to_resolvers} meta l4proto {{ tcp, udp }} th dport 53 accept"
    ports = ", ".join(str(p) for p in sorted(set(host_tcp_ports)))
    host_ports_rule = f"tcp dport {{ {ports} }} accept" if ports else ""
    # The leading "add table" makes the "delete table" valid when the table does not exist yet,
    # so the whole replacement is one transaction whatever the current state.
    return f"""
add table inet {table}
delete table inet {table}
table inet {table} {{
    set desktops {{ type ipv4_addr; {elements(ips)} }}
    set no_internet {{ type ipv4_addr; {elements(no_internet)} }}
    set egress_allow {{ type ipv4_addr . ipv4_addr; flags interval; {elements(egress)} }}
    set denied {{ type ipv4_addr; flags interval; {elements(denied)} }}

    chain input {{
        type filter hook input priority filter; policy accept;
        iifname != "{bridge}" accept
        ct state established,related accept
        ip saddr != @desktops drop
        icmp type echo-request accept
        udp dport {{ 53, 67 }} ip daddr {{ {gateway}, 255.255.255.255 }} accept
        {host_ports_rule}
        drop
    }}

    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{bridge}" oifname "{bridge}" drop
        oifname "{bridge}" ct state established,related accept
        oifname "{bridge}" drop
        iifname "{bridge}" meta nfproto ipv6 drop
        iifname "{bridge}" ip saddr != @desktops drop
        {dns_rule}
        iifname "{bridge}" ip daddr @denied counter drop
        iifname "{bridge}" ip saddr @no_internet ip saddr . ip daddr @egress_allow accept
        iifname "{bridge}" ip saddr @no_internet drop
    }}

    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr {subnet} oifname != "{bridge}" masquerade
    }}
}}

add table bridge {table}
delete table bridge {table}
table bridge {table} {{
    set bindings {{ type ifname . ether_addr . ipv4_addr; {elements(bindings)} }}

    # A frame the bridge drops here is never learnt either: no spoofed MAC reaches its table.
    chain prerouting {{
        type filter hook prerouting priority filter; policy accept;
        iifname != "{veth_prefix}*" accept
        ether type != {{ ip, arp }} counter drop
        ether type ip iifname . ether saddr . ip saddr != @bindings counter drop
        ether type arp iifname . ether saddr . arp saddr ip != @bindings counter drop
        ether type arp iifname . arp saddr ether . arp saddr ip != @bindings counter drop
    }}

    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{veth_prefix}*" oifname "{veth_prefix}*" drop
    }}
}}
"""


def apply(ruleset: str) -> None:
    result = run(["nft", "-f", "-"], stdin=ruleset)
    if result.returncode != 0:
        raise RuntimeError(f"nft rejected the project's firewall: {result.stderr.strip()}")


def ensure_bridge(bridge: str, subnet: str) -> None:
    """Create the bridge with the host's address on it; a no-op when it is already there."""
    address = f"{gateway_of(subnet)}/{ipaddress.ip_network(subnet).prefixlen}"
    if run(["ip", "link", "show", "dev", bridge]).returncode != 0:
        _ip("link", "add", bridge, "type", "bridge")
    shown = run(["ip", "-4", "-o", "addr", "show", "dev", bridge])
    if f" {address} " not in shown.stdout:
        _ip("addr", "replace", address, "dev", bridge)
    _ip("link", "set", bridge, "up")
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        forwarding = f.read().strip() == "1"
    if not forwarding:
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1\n")


def _ip(*args: str) -> None:
    result = run(["ip", *args])
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def run(command: list[str], stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a host tool (found on PATH: these are root's system tools, never user input)."""
    return subprocess.run(  # noqa: S603
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Create the LXC driver's bridge and an empty firewall.")
    parser.add_argument("--bridge", default="lbbr0")
    parser.add_argument("--subnet", default="10.213.0.0/24")
    parser.add_argument("--table", default=TABLE)
    parser.add_argument("--veth-prefix", default=VETH_PREFIX)
    args = parser.parse_args()
    ensure_bridge(args.bridge, args.subnet)
    # Only when the table is missing: replacing it would drop the rules of running desktops
    # (the driver re-renders them with their addresses on its next change).
    if run(["nft", "list", "table", "inet", args.table]).returncode != 0:
        apply(render_ruleset(args.bridge, args.subnet, [], (), args.table, args.veth_prefix))
    print(f"bridge {args.bridge} ({gateway_of(args.subnet)}) and nftables tables '{args.table}' ready")


if __name__ == "__main__":
    main()
